"""A real `pagedchat serve` (uvicorn) in a subprocess on a free loopback port, with a temp SQLite DB.

The process itself is bench's harness (bench/common/servers.py); here: the test settings and the admin checks.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.common.servers import ServerProcess, spawn_pagedchat, stop_server, wait_ready
from engine.core import paths
from tests.app.factories import TINY_BLOCK_BYTES, make_tiny_model_dir, pool_is_idle
from tests.e2e.zygote import fork_server
from tests.faults import FAULTS_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180.0


class Server(ServerProcess):
    """A test server: bench's process handle plus the admin checks the tests assert on."""

    def admin_state(self) -> dict[str, Any]:
        """The block pool: with the server's admin token where it has one (a server without accounts or token
        answers loopback)."""
        response = httpx.get(self.base_url + "/api/admin/state", headers=self.admin_headers, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    @property
    def admin_headers(self) -> dict[str, str]:
        """The X-Admin-Token header of a server started with PAGEDCHAT_ADMIN_TOKEN, else none."""
        token = self.env.get("PAGEDCHAT_ADMIN_TOKEN")
        return {"X-Admin-Token": token} if token else {}

    def wait_pool_idle(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll until no block is in use and no sequence is live."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.admin_state()
            if pool_is_idle(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"pool not idle after {timeout_s} s: {state['stats']}")
            time.sleep(0.05)

    def wait_tier_written(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Poll until the pool is idle (finished sequences have offered their blocks to the disk tier) and the
        tier's write queue is empty; the tier's stats."""
        self.wait_pool_idle(timeout_s)
        deadline = time.monotonic() + timeout_s
        while (tier := self.admin_state()["stats"]["tier"])["write_queue_depth"]:
            if time.monotonic() > deadline:
                raise AssertionError(f"disk tier writes still queued after {timeout_s} s: {tier}")
            time.sleep(0.02)
        return tier


def server_env(tmp_path: Path, model: str, **env: str) -> dict[str, str]:
    """Environment of a test server: tiny pool, CPU fp32, its own cache dir (its database: start_server's) whose
    compiled kernels are shared with every test server (see share_kernels)."""
    share_kernels(tmp_path / "cache")
    values = {
        "PAGEDCHAT_MODEL": model,
        "PAGEDCHAT_CACHE_DIR": str(tmp_path / "cache"),
        "PAGEDCHAT_DEVICE": "cpu",
        "PAGEDCHAT_DTYPE": "float32",
        "PAGEDCHAT_BLOCK_SIZE": "16",
        "PAGEDCHAT_KV_CACHE_BYTES": str(256 * 16 * TINY_BLOCK_BYTES),
        "PAGEDCHAT_MAX_MODEL_LEN": "512",
        "PAGEDCHAT_MAX_NUM_SEQS": "8",
        "PAGEDCHAT_NUM_THREADS": "1",
        "PAGEDCHAT_FLUSH_INTERVAL_S": "0.05",
        "PAGEDCHAT_SHUTDOWN_GRACE_S": "2",
        "PAGEDCHAT_LOG_LEVEL": "info",
    }
    values.update(env)
    return values


def share_kernels(cache_dir: Path) -> None:
    """Point a server cache dir's kernels/ at the folder this test process builds its own into (the default cache
    dir's, engine.core.paths): each native kernel is compiled once for the whole run, by whichever test needs it
    first, in process or in a server (~7 s each for quant_linear and attention on 2 cores, several times that
    under the suite's load). Safe to share: a library's name is a digest of its source and flags, and builders
    publish it with an atomic rename."""
    shared = paths.cache_dir() / "kernels"
    shared.mkdir(parents=True, exist_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    link = cache_dir / "kernels"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)


def start_server(
    tmp_path: Path, env: dict[str, str], *, port: int | None = None, database_url: str | None = None
) -> Server:
    """Start `pagedchat serve` and wait until /health says ok (fails with the server's log otherwise)."""
    server = spawn_server(tmp_path, env, port=port, database_url=database_url)
    wait_ready(server, STARTUP_TIMEOUT_S)
    return server


def spawn_server(
    tmp_path: Path, env: dict[str, str], *, port: int | None = None, database_url: str | None = None
) -> Server:
    """Start `pagedchat serve` without waiting for it (a test of a start that must fail waits for its exit).

    The process is forked from a process that has imported the server already (tests/e2e/zygote.py: ~5 s less a
    start). Only `env` reaches it of the PAGEDCHAT_* variables; servers started again on one `tmp_path` share its
    database (chat.db, unless `database_url` names another) and log (server.log). When `env` sets FAULTS_ENV, the
    server runs under tests/fault_server.py: the same server, its engine faulty.
    """
    command = ("tests.fault_server",) if FAULTS_ENV in env else ("pagedchat", "serve")
    return spawn_pagedchat(
        "server",
        env,
        tmp_path,
        db_path=tmp_path / "chat.db",
        port=port,
        isolated=True,
        server_type=Server,
        command=command,
        database_url=database_url,
        launch=fork_server,
    )


@pytest.fixture(scope="module")
def tiny_model() -> str:
    """The tiny random model's folder (SmolLM2's tokenizer)."""
    return str(make_tiny_model_dir())


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    """One server for a test module, tiny model, loopback, no keys."""
    tmp_path = tmp_path_factory.mktemp("server")
    running = start_server(tmp_path, server_env(tmp_path, tiny_model))
    yield running
    stop_server(running)
    assert "Application shutdown complete." in running.log(), running.log()[-4000:]


@pytest.fixture(scope="session")
def shared_cache_dir(tmp_path_factory) -> Path:
    """A cache dir (PAGEDCHAT_CACHE_DIR) for servers to share: the native kernels are compiled once, not at every
    server's first start (seconds each). A test that uses it for its disk tier's default place (<cache dir>/kv)
    owns that place: the others give their servers a PAGEDCHAT_KV_DISK_DIR of their own."""
    path = tmp_path_factory.mktemp("cache")
    share_kernels(path)
    return path


@pytest.fixture
def server_factory(tmp_path, tiny_model) -> Iterator[Callable[..., Server]]:
    """Start servers on this test's directory (same database across restarts), or on a sub-directory `home` of it
    (a server of its own: its database, cache dir and log); all are stopped afterwards."""
    started: list[Server] = []

    def start(home: str | None = None, **env: str) -> Server:
        directory = tmp_path / home if home else tmp_path
        directory.mkdir(exist_ok=True)
        running = start_server(directory, server_env(directory, env.pop("model", tiny_model), **env))
        started.append(running)
        return running

    yield start
    for running in started:
        stop_server(running, signal.SIGKILL, timeout_s=10)
