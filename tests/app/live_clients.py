"""The apps `make_client` has running, and the check that none of their block pools holds a block once a test is
over: a test that leaks a sequence fails itself, at its teardown, whatever order the tests run in (a test that
looked at the pool once passed whenever it happened to run before the leak, or alone)."""

from __future__ import annotations

import time
from typing import Any

from starlette.testclient import TestClient

# make_client is a plain context manager, not a fixture: it leaves its clients here for the autouse fixture of
# tests/conftest.py to find. Only make_client adds and removes entries.
LIVE_CLIENTS: list[TestClient] = []


def engine_state(client: TestClient) -> dict[str, Any]:
    """What /api/admin/state returns, read on the client's own event loop instead of over HTTP: no admin token or
    sign-in is needed (clients with accounts on have neither), and no request lands in the metrics, the logs or the
    admin rate limiter that a test may be counting."""
    from app.admin.ops import replicas_state, service_state, snapshot_to_json

    svc = client.app.state.services
    assert client.portal is not None, "the client's lifespan is not running (outside its `with` block)"
    if svc.engine.health() is None:
        [(_, snap)] = client.portal.call(svc.engine.snapshot_each)
        state = snapshot_to_json(snap)
    else:
        state = client.portal.call(replicas_state, svc)
    return {**state, "service": service_state(svc)}


def blocks_in_use(state: dict[str, Any]) -> list[str]:
    """What an admin state shows still held: per pool (one, or each replica's), blocks in use and live sequences."""
    pools = state.get("replicas", [state])
    held = []
    for pool in pools:
        name = f"replica {pool['name']}: " if "name" in pool else ""
        num_used = pool.get("block_states", "").count("u")
        if num_used or pool.get("sequences"):
            seq_ids = [seq["seq_id"] for seq in pool.get("sequences", [])]
            held.append(
                f"{name}{num_used} blocks in use, live sequences {seq_ids}, owners {pool['block_owners']}"
            )
    return held


def check_pool_idle(client: TestClient, timeout_s: float = 5.0) -> None:
    """Wait (aborts land at the engine's next step) until the client's pool holds no block and no sequence; raise
    AssertionError naming what stayed in use after `timeout_s`. An engine that no longer serves (a test killed
    its thread on purpose) is not checked: its pool cannot be read, and it serves no later test."""
    if not client.app.state.services.engine.healthy:
        return
    deadline = time.monotonic() + timeout_s
    while held := blocks_in_use(engine_state(client)):
        if time.monotonic() > deadline:
            settings = client.app.state.services.settings
            raise AssertionError(
                f"blocks stayed in use {timeout_s} s after the test (app at {settings.cache_dir}): {held}"
            )
        time.sleep(0.02)


def check_live_clients(timeout_s: float = 5.0) -> None:
    """`check_pool_idle` on every client make_client has open."""
    for client in list(LIVE_CLIENTS):
        check_pool_idle(client, timeout_s)
