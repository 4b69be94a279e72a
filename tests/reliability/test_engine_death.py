"""The engine thread dies while a real server (uvicorn, `tests.fault_server`) streams a reply.

With `--exit-on-engine-failure` (the default) the reply in flight gets the error, the server logs at CRITICAL that
it exits, drains and exits with status 70: a supervisor's restart policy (systemd `Restart=on-failure`) then
restarts it. Off, the process stays up answering 503, `/health` unhealthy, until something restarts it.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from bench.common.servers import stop_server
from tests.app.factories import make_tiny_model_dir
from tests.e2e.conftest import Server, server_env, start_server
from tests.faults import FAULTS_ENV
from tests.reliability.helpers import faulty

ENGINE_FAILURE = 70  # app.http.server.ENGINE_FAILURE, written out: the status is what supervisors see
REASON = "engine thread died: InjectedFault: injected die fault"
# 400 tokens take 8 s: the reply is still running when the engine dies
FAULTY = {FAULTS_ENV: "markers,step_delay_ms=20"}


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return str(make_tiny_model_dir())


class Stream(threading.Thread):
    """A /v1 chat stream read on a thread: its SSE data lines as they come."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.url = server.base_url + "/v1/chat/completions"
        self.data: list[str] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 400, "ignore_eos": True}
        try:
            with httpx.stream("POST", self.url, json={**body, "stream": True}, timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.data.append(line[5:].strip())
        except httpx.TransportError as exc:
            self.failure = exc

    def wait_for_chunks(self, n: int = 3, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.data) < n:
            assert time.monotonic() < deadline and self.is_alive(), (self.failure, self.data[-3:])
            time.sleep(0.01)

    @property
    def errors(self) -> list[dict]:
        return [event["error"] for event in map(json.loads, self.data[:-1]) if "error" in event]


def kill_engine(server: Server) -> httpx.Response:
    """A request whose prompt makes the engine thread die (tests/faults.py, site `die`)."""
    body = {"messages": faulty("die"), "max_tokens": 5}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)


def test_the_server_exits_with_70_when_its_engine_dies(tmp_path, tiny_model):
    server = start_server(tmp_path, server_env(tmp_path, tiny_model, **FAULTY))
    try:
        stream = Stream(server)
        stream.start()
        stream.wait_for_chunks()
        died = time.monotonic()
        dying = kill_engine(server)
        assert (dying.status_code, dying.json()["error"]["message"]) == (500, REASON)
        stream.join(timeout=10)
        # the reply in flight ended with the error, its stream closed as usual
        assert not stream.is_alive() and stream.failure is None, stream.failure
        assert stream.errors and stream.errors[-1]["message"] == REASON, stream.data[-3:]
        assert stream.data[-1] == "[DONE]"
        assert server.process.wait(timeout=10) == ENGINE_FAILURE
        assert time.monotonic() - died < 5
    finally:
        stop_server(server, signal.SIGKILL, timeout_s=10)
    log = server.log()
    exiting = [line for line in log.splitlines() if "exiting with status 70" in line]
    assert len(exiting) == 1 and " CRITICAL " in exiting[0], log[-3000:]
    assert "so that a supervisor restarts the server: " + REASON in exiting[0]
    assert "Application shutdown complete." in log, log[-3000:]  # drained and shut down, not killed


def test_with_exit_on_engine_failure_off_the_server_stays_up_unhealthy(tmp_path, tiny_model):
    env = server_env(tmp_path, tiny_model, PAGEDCHAT_EXIT_ON_ENGINE_FAILURE="0", **FAULTY)
    server = start_server(tmp_path, env)
    try:
        dying = kill_engine(server)
        assert (dying.status_code, dying.json()["error"]["message"]) == (500, REASON)
        time.sleep(1.0)
        assert server.process.poll() is None
        health = httpx.get(server.base_url + "/health", timeout=10)
        assert (health.status_code, health.json()) == (503, {"status": "unhealthy", "reason": REASON})
        refused = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=10,
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == f"the engine is not running: {REASON}"
        # a stop is still a stop: SIGTERM drains and ends it as usual
        assert stop_server(server) in (0, -signal.SIGTERM)
    finally:
        stop_server(server, signal.SIGKILL, timeout_s=10)
    log = server.log()
    assert "exiting with status" not in log and "Application shutdown complete." in log, log[-3000:]
