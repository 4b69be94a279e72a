"""CI load: two identical rounds of tests/load_round.py against a real uvicorn server injecting faults.

Each round holds 64 streams open at once, then mixes SSE, WebSocket and plain requests with disconnects, stops,
multi-turn sessions and faulty requests. Afterwards no block is in use, nothing waits, the service holds no stream,
and the server's RSS after the second round is within RSS_BOUND_MIB of the first (the longer mode: tests/soak.py).
"""

from __future__ import annotations

import asyncio

import pytest

from bench.common.servers import stop_server
from tests.e2e.conftest import server_env, start_server
from tests.load_round import LoadConfig, faults_injected, rss_bytes, run_round, wait_idle
from tests.soak import server_settings

STREAMS = 64
RSS_BOUND_MIB = 48  # the stated bound: a round's garbage and allocator slack, far below a per-request leak


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    tmp_path = tmp_path_factory.mktemp("load")
    running = start_server(tmp_path, server_env(tmp_path, tiny_model, **server_settings(faults=True)))
    yield running
    stop_server(running)
    assert "Application shutdown complete." in running.log()


@pytest.fixture(scope="module")
def tiny_model():
    from tests.app.factories import make_tiny_model_dir

    return str(make_tiny_model_dir())


@pytest.mark.budget(
    seconds=60, why="two full rounds of 64 streams and mixed jobs on a faulty server: the load is the test"
)
def test_two_identical_rounds_hold_64_streams_and_leave_nothing_behind(server, tiny_model):
    cfg = LoadConfig(
        base_url=server.base_url, model=tiny_model.rsplit("/", 1)[-1], num_streams=STREAMS, faults=True
    )
    rss = []
    for _ in range(2):
        report = asyncio.run(run_round(cfg))
        state = asyncio.run(wait_idle(server.base_url))
        rss.append(rss_bytes(server.process.pid))
        print("round:", report.to_json(), "faults injected so far:", asyncio.run(faults_injected(cfg)))
        assert report.problems == []
        assert report.peak_streams >= STREAMS
        assert sum(report.outcomes.values()) == report.num_jobs == cfg.num_jobs
        assert sum(n for k, n in report.outcomes.items() if "aborted" in k or "closed mid-reply" in k) > 0
        assert sum(n for k, n in report.outcomes.items() if "fault" in k) > 0
        assert state["block_states"].count("u") == 0 and state["stats"]["num_waiting"] == 0
        assert state["service"]["in_flight_requests"] == state["service"]["pending_outputs"] == 0
    growth_mib = (rss[1] - rss[0]) / 2**20
    print(f"server RSS {rss[0] / 2**20:.1f} -> {rss[1] / 2**20:.1f} MiB")
    assert growth_mib <= RSS_BOUND_MIB
    assert (
        server.admin_state()["stats"]["num_preemptions"] > 0
    )  # 32 sequences in 256 blocks: the pool was tight
