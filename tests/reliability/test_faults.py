"""Faults injected by marker (tests/faults.py) into the real tiny engine, in-process.

A fault attributable to one request (its detokenization, its stop handling, the delivery of its output) fails that
request with a clear error and nothing else; a fault in a batched model step fails that step's requests; the engine
thread keeps serving; every block comes back.
"""

from __future__ import annotations

import json
import logging

import pytest

from tests.app.factories import make_client
from tests.faults import FaultPlan
from tests.reliability.helpers import (
    HELLO,
    concurrently,
    faulty,
    session_events,
    stream_chat,
    wait_service_idle,
)

GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def plan() -> FaultPlan:
    return FaultPlan(markers=True)


@pytest.fixture(scope="module")
def client(tmp_path_factory, plan):
    with make_client(tmp_path_factory.mktemp("faults"), faults=plan, max_num_seqs=8) as c:
        yield c


def chat(client, messages, **body):
    return client.post("/v1/chat/completions", json={"messages": messages, **GREEDY, **body})


@pytest.mark.parametrize(
    ("site", "message"),
    [
        ("detokenize", "detokenization failed: InjectedFault: injected detokenize fault"),
        ("deliver", "output delivery failed: InjectedFault: injected deliver fault"),
    ],
)
def test_a_per_request_fault_fails_only_that_request(client, plan, site, message):
    before = plan.injected[site]
    bad, *good = concurrently(
        lambda: chat(client, faulty(site)),
        *[lambda i=i: chat(client, [{"role": "user", "content": f"neighbour {i}"}]) for i in range(4)],
    )
    assert bad.status_code == 500
    assert bad.json()["error"] == {
        "message": message,
        "type": "server_error",
        "param": None,
        "code": "request_failed",
    }
    for response in good:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 12
    assert plan.injected[site] == before + 1
    wait_service_idle(client)
    assert client.get("/health").json()["status"] == "ok"


def test_a_streamed_request_gets_an_error_event_then_done(client):
    events = stream_chat(client, {"messages": faulty("detokenize"), **GREEDY})
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == (
        "detokenization failed: InjectedFault: injected detokenize fault"
    )
    wait_service_idle(client)


def test_a_fault_in_stop_string_handling_fails_only_that_request(client):
    # greedy output is deterministic: learn the text, then ask again with a stop string taken from it
    prompt = faulty("stop", "Count with me")
    plain = chat(client, prompt)
    assert plain.status_code == 200  # no stop string matched, so the stop fault never fired
    text = plain.json()["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 :][:3]
    assert stop.strip(), f"need a visible stop string from {text!r}"
    stopped, neighbour = concurrently(
        lambda: chat(client, prompt, stop=[stop]),
        lambda: chat(client, HELLO, stop=[stop]),
    )
    assert stopped.status_code == 500
    assert stopped.json()["error"]["message"] == "detokenization failed: InjectedFault: injected stop fault"
    assert neighbour.status_code == 200
    wait_service_idle(client)


def test_a_batched_step_fault_fails_the_step_and_the_engine_keeps_serving(client, plan):
    before = plan.injected["step"]
    responses = concurrently(
        lambda: chat(client, faulty("step"), max_tokens=40),
        *[
            lambda i=i: chat(client, [{"role": "user", "content": f"batch {i}"}], max_tokens=40)
            for i in range(3)
        ],
    )
    assert responses[0].status_code == 500
    step_error = "engine step failed: InjectedFault: injected step fault"
    assert responses[0].json()["error"]["message"] == step_error
    for response in responses[1:]:  # each either shared the faulty step (and failed with it) or finished
        if response.status_code == 500:
            assert response.json()["error"]["message"] == step_error
        else:
            assert response.status_code == 200
            assert response.json()["usage"]["completion_tokens"] == 40
    assert plan.injected["step"] == before + 1
    wait_service_idle(client)
    assert chat(client, HELLO).status_code == 200


def until_done(ws) -> list[dict]:
    frames = [ws.receive_json()]
    while frames[-1]["type"] != "done":
        frames.append(ws.receive_json())
    return frames


@pytest.mark.parametrize("site", ["deliver", "detokenize"])
def test_a_faulty_session_turn_is_stored_failed_and_the_socket_goes_on(client, site):
    sid = client.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 5}}).json()["id"]
    with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
        ws.send_json({"type": "message", "content": faulty(site)[0]["content"]})
        done = until_done(ws)[-1]
        assert done["message"]["status"] == "failed"
        assert done["message"]["error"].endswith(f"InjectedFault: injected {site} fault")
        # the marker stays in the history, so edit the faulty turn away and go on on the same socket
        ws.send_json({"type": "edit", "content": "and now?"})
        assert until_done(ws)[-1]["message"]["status"] == "finished"
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [(m["content"], m["status"]) for m in stored][0] == ("and now?", "complete")
    assert [m["status"] for m in stored] == ["complete", "finished"]
    other = client.post("/api/sessions").json()["id"]
    events = session_events(client, other, faulty(site)[0]["content"])
    assert (events[-1]["type"], events[-1]["message"]["status"]) == ("done", "failed")
    wait_service_idle(client)


def test_a_dead_engine_thread_is_logged_reported_and_refuses_work(tmp_path, caplog):
    caplog.set_level(logging.CRITICAL, logger="app.engine_client.async_engine")
    with make_client(tmp_path, faults=FaultPlan(markers=True)) as client:
        dying = chat(client, faulty("die"))
        reason = "engine thread died: InjectedFault: injected die fault"
        assert (dying.status_code, dying.json()["error"]["message"]) == (500, reason)
        health = client.get("/health")
        assert (health.status_code, health.json()) == (503, {"status": "unhealthy", "reason": reason})
        refused = chat(client, HELLO)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["message"] == f"the engine is not running: {reason}"
        sid = client.post("/api/sessions").json()["id"]
        with client.websocket_connect(f"/ws/sessions/{sid}") as ws:
            ws.send_json({"type": "message", "content": "anyone?"})
            error = ws.receive_json()
        assert (error["type"], error["status"], error["message"]) == (
            "error",
            503,
            f"the engine is not running: {reason}",
        )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL] == [reason]
