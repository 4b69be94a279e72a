"""Faults injected into the real engine: failed steps, a slow engine past the timeout, and a dead engine thread."""

from __future__ import annotations

import json
import time

import pytest

from tests.app.factories import make_client, sse_events, wait_pool_idle

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("faults"), request_timeout_s=1.0) as c:
        yield c


def llm_engine(client):
    return client.app.state.services.engine.engine


class FailOnce:
    """Replaces a callable: raises RuntimeError('injected') on its first call, then behaves as the original."""

    def __init__(self, original):
        self.original = original
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("injected")
        return self.original(*args, **kwargs)


@pytest.fixture
def fail_next_forward(client):
    runner = llm_engine(client).runner
    runner.execute = FailOnce(runner.execute)
    yield
    del runner.execute  # back to the class's method


@pytest.fixture
def fail_next_step(client):
    engine = llm_engine(client)
    engine.step = FailOnce(engine.step)
    yield
    del engine.step


def test_a_failed_model_step_fails_its_request_and_the_engine_keeps_serving(client, fail_next_forward):
    response = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "engine step failed: RuntimeError: injected"
    assert client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5}).status_code == 200
    wait_pool_idle(client)


def test_a_raising_step_fails_in_flight_streams_with_an_error_event(client, fail_next_step):
    body = {"messages": HELLO, "max_tokens": 5, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200  # headers went out before the first step
        events = sse_events(response.iter_lines())
    assert events[-1]["data"] == "[DONE]"
    error = json.loads(events[-2]["data"])["error"]
    assert error["message"] == "engine step failed: RuntimeError: injected"
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 3}).status_code == 200
    wait_pool_idle(client)


def test_a_failed_session_reply_is_stored_as_failed_and_the_next_turn_works(client, fail_next_forward):
    sid = client.post("/api/sessions", json={"settings": {"max_tokens": 4}}).json()["id"]
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "hi"}) as response:
        done = json.loads(sse_events(response.iter_lines())[-1]["data"])
    assert (done["type"], done["message"]["status"]) == ("done", "failed")
    assert done["message"]["error"] == "engine step failed: RuntimeError: injected"
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "again"}) as response:
        again = json.loads(sse_events(response.iter_lines())[-1]["data"])
    assert again["message"]["status"] == "finished"
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [
        ("user", "complete"),
        ("assistant", "failed"),
        ("user", "complete"),
        ("assistant", "finished"),
    ]
    assert stored[1]["error"] == "engine step failed: RuntimeError: injected"


def test_the_request_timeout_aborts_a_slow_request(client):
    engine = llm_engine(client)
    original = engine.step

    def slow_step():
        time.sleep(0.02)
        return original()

    engine.step = slow_step
    try:
        started = time.monotonic()
        response = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 200})
        elapsed = time.monotonic() - started
    finally:
        del engine.step
    assert response.status_code == 504
    message = response.json()["error"]["message"]
    assert message.startswith("request chatcmpl-") and message.endswith("exceeded the 1 s request timeout")
    assert 1.0 <= elapsed < 3.0
    wait_pool_idle(client)


def test_a_dead_engine_thread_turns_health_red_and_new_requests_get_503(tmp_path):
    with make_client(tmp_path) as client:
        engine = llm_engine(client)

        def die():
            raise RuntimeError("injected death")

        engine.has_unfinished_requests = die
        in_flight = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5})
        assert in_flight.status_code == 500
        assert in_flight.json()["error"]["message"] == "engine thread died: RuntimeError: injected death"
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json() == {
            "status": "unhealthy",
            "reason": "engine thread died: RuntimeError: injected death",
        }
        refused = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5})
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == (
            "the engine is not running: engine thread died: RuntimeError: injected death"
        )
        sid = client.post("/api/sessions").json()["id"]
        reply = client.post(f"/api/sessions/{sid}/messages", json={"content": "hi"})
        assert reply.status_code == 503
        page = client.get("/admin")  # the operator's page still shows the engine's settings
        assert page.status_code == 200 and "Bytes per block" in page.text


@pytest.mark.parametrize(("exit_on_failure", "dies"), [(True, True), (False, True), (True, False)])
def test_the_server_hears_of_a_dead_engine_only_when_so_set(tmp_path, exit_on_failure, dies):
    """The server's hook (app.http.server.DrainingServer) hears of a death while serving; never of a normal stop
    (the client's exit), and never with --no-exit-on-engine-failure."""
    heard: list[str] = []
    with make_client(tmp_path, exit_on_engine_failure=exit_on_failure) as client:
        client.app.state.shutdown.on_engine_failure = heard.append
        if dies:
            llm_engine(client).has_unfinished_requests = _die
        in_flight = client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5})
        assert in_flight.status_code == (500 if dies else 200)
    reason = "engine thread died: RuntimeError: injected death"
    assert heard == ([reason] if exit_on_failure and dies else [])


def _die() -> bool:
    raise RuntimeError("injected death")
