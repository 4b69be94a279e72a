"""Limits with clear errors: per-client rate and concurrency, request sizes, and slow readers held to bounded memory.

A little over 300 lines: one file per limit table of the README (Reliability > Limits), kept whole so the two match.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest

from app.chat.reply import Reply
from app.engine_client.request_stream import RequestStream
from app.http.limits import ClientLimiter
from engine.core.outputs import CompletionOutput, RequestOutput
from engine.core.sequence import MAX_N, MAX_STOP_STRING_LEN, MAX_STOP_STRINGS
from tests.app.factories import make_client, sse_events
from tests.faults import FaultPlan
from tests.reliability.helpers import HELLO, concurrently, peer, wait_service_idle

KEYS = {"authorization": "Bearer sk-one"}, {"authorization": "Bearer sk-two"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("limits"),
        api_keys=("sk-one", "sk-two"),
        client_requests_per_minute=1000,  # the rate test below swaps in a tighter limiter of its own
        client_max_streams=2,
        max_messages=8,
        max_body_bytes=4096,
        faults=FaultPlan(step_delay_s=0.01),
    ) as c:
        limiter = c.app.state.services.admission.limiter
        assert (limiter.requests_per_minute, limiter.max_streams) == (1000, 2)
        yield c


def chat(client, headers, **body):
    return client.post(
        "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, **body}, headers=headers
    )


def test_concurrent_requests_per_client_are_capped_and_released(client):
    hold = threading.Event()

    def long_stream(headers):
        body = {"messages": HELLO, "max_tokens": 40, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            hold.wait(10)
            return sse_events(list(lines))[-1]["data"]

    one = KEYS[0]
    threads = [threading.Thread(target=long_stream, args=(one,)) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while client.app.state.services.admission.limiter.in_flight("key:" + _fp("sk-one")) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    refused = chat(client, one)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"] == {
        "message": "too many concurrent requests for this client: the limit is 2 at once; wait for one to finish",
        "type": "rate_limit_error",
        "param": None,
        "code": "too_many_concurrent_requests",
    }
    assert chat(client, KEYS[1]).status_code == 200  # another key has its own allowance
    hold.set()
    for t in threads:
        t.join(10)
    assert client.app.state.services.admission.limiter.in_flight("key:" + _fp("sk-one")) == 0


def _fp(key: str) -> str:
    from app.http.security import key_fingerprint

    return key_fingerprint(key)


def test_requests_per_minute_per_client(client, monkeypatch):
    monkeypatch.setattr(client.app.state.services.admission, "limiter", ClientLimiter(6, 0))
    two = {"authorization": "Bearer sk-two"}
    browser = peer(client)
    sid = browser.post("/api/sessions", json={"settings": {"max_tokens": 2}}).json()["id"]
    assert [chat(client, two).status_code for _ in range(6)] == [200] * 6
    refused = chat(client, two)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    message = refused.json()["error"]["message"]
    assert message.startswith("rate limit reached: at most 6 requests per minute for this client; retry in ")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert client.get("/v1/models", headers=two).status_code == 200  # only generation requests count
    # a browser is its own client; its socket turns count too, and the refusal is an error frame
    with browser.websocket_connect(f"/ws/sessions/{sid}") as ws:
        for _ in range(6):
            ws.send_json({"type": "message", "content": "hi"})
            frames = [ws.receive_json()]
            while frames[-1]["type"] not in ("done", "error"):
                frames.append(ws.receive_json())
            assert frames[-1]["type"] == "done"
        ws.send_json({"type": "message", "content": "one more"})
        error = ws.receive_json()
        assert (error["type"], error["status"], error["code"]) == ("error", 429, "rate_limit_exceeded")
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": HELLO * 9}, "messages", "messages holds 9 messages, over the limit of 8"),
        ({"messages": HELLO, "n": MAX_N + 1}, "n", f"n must be an integer in [1, {MAX_N}], got {MAX_N + 1}"),
        (
            {"messages": HELLO, "stop": ["s"] * (MAX_STOP_STRINGS + 1)},
            "stop",
            f"stop may hold at most {MAX_STOP_STRINGS} strings, got {MAX_STOP_STRINGS + 1}",
        ),
        (
            {"messages": HELLO, "stop": "x" * (MAX_STOP_STRING_LEN + 1)},
            "stop",
            f"a stop string may be at most {MAX_STOP_STRING_LEN} characters, got {MAX_STOP_STRING_LEN + 1}",
        ),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens", "max_tokens must be a positive integer, got 0"),
        (
            {"messages": HELLO, "max_tokens": 600},
            "max_tokens",
            "prompt (31 tokens) + max_tokens (600) exceeds max_model_len (512): "
            "shorten the prompt, lower max_tokens, or start the server with a larger --max-model-len",
        ),
        (
            {"messages": [{"role": "user", "content": "word " * 700}], "max_tokens": 2},
            "max_tokens",
            "prompt (731 tokens) + max_tokens (2) exceeds max_model_len (512): "
            "shorten the prompt, lower max_tokens, or start the server with a larger --max-model-len",
        ),
    ],
)
def test_limits_have_clear_errors(client, body, param, message):
    response = client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-one"})
    assert response.status_code == 400
    assert (response.json()["error"]["param"], response.json()["error"]["message"]) == (param, message)


def test_body_size_counts_the_bytes_received(client):
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    for content in (body, iter([body[:2000], body[2000:]])):  # with and without Content-Length
        response = client.post(
            "/v1/chat/completions", content=content, headers={"authorization": "Bearer sk-one"}
        )
        assert response.status_code == 413
        assert response.json()["error"]["message"].endswith("exceeds the limit of 4096 bytes")
    lying = client.post(
        "/api/sessions",
        content=iter([b'{"title": "', b"x" * 5000, b'"}']),
        headers={"content-length": "20", "authorization": "Bearer sk-one"},
    )
    assert lying.status_code in (400, 413)  # a short Content-Length does not let more bytes through


def output(i: int, finished: bool = False, samples: int = 1) -> RequestOutput:
    outs = [
        CompletionOutput(index=k, text="", token_ids=[0] * (i + 1), text_delta=f"<{k}:{i}>", num_new_tokens=1)
        for k in range(samples)
    ]
    return RequestOutput("r", [1], outs, 0, finished)


def test_a_slow_consumer_holds_one_merged_output_not_one_per_step():
    async def scenario():
        stream = RequestStream("r", 60, abort=lambda _: None, unregister=lambda _: None)
        for i in range(1000):
            stream.push(output(i, finished=i == 999, samples=2))
        assert stream.num_pending == 1
        merged = [o async for o in stream]
        assert len(merged) == 1
        assert merged[0].finished
        for k in range(2):
            assert merged[0].outputs[k].text_delta == "".join(f"<{k}:{i}>" for i in range(1000))
            assert merged[0].outputs[k].num_new_tokens == 1000

        reply = Reply("s", "r")
        reply.emit({"type": "start"})
        for i in range(1000):
            reply.emit({"type": "delta", "text": str(i % 10)})
        reply.emit({"type": "done"})
        assert len(reply.events) == 3
        events = [e async for e in reply.iter_events()]
        assert events[1] == {"type": "delta", "text": "0123456789" * 100}

    asyncio.run(scenario())


def test_a_stalled_sse_reader_keeps_one_pending_output_then_gets_it_all(client):
    one = {"authorization": "Bearer sk-one"}
    body = {"messages": HELLO, "max_tokens": 60, "ignore_eos": True, "temperature": 0}
    whole = client.post("/v1/chat/completions", json=body, headers=one).json()["choices"][0]["message"][
        "content"
    ]
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=one
    ) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        # the in-process transport applies backpressure: the app's sends wait for this reader, which waits here
        deadline = time.monotonic() + 10
        while client.get("/api/admin/state", headers=one).json()["sequences"]:
            assert time.monotonic() < deadline, "the request should finish in the engine without its reader"
            time.sleep(0.05)
        state = client.get("/api/admin/state", headers=one).json()
        assert state["service"]["pending_outputs"] <= 1
        assert "u" not in state["block_states"]  # finished in the engine: its blocks are back already
        events = [first[len("data: ") :]] + [e["data"] for e in sse_events(list(lines))]
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    wait_service_idle(client)


def test_a_reader_stalled_past_the_timeout_is_cut_off_and_its_request_aborted(tmp_path):
    with make_client(tmp_path, slow_reader_timeout_s=0.5, faults=FaultPlan(step_delay_s=0.02)) as client:
        body = {"messages": HELLO, "max_tokens": 300, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            time.sleep(1.5)  # not reading: the send times out after 0.5 s and the stream is torn down
            state = wait_service_idle(client, timeout_s=5)
        assert state["stats"]["num_generation_tokens_total"] < 300 + 2  # aborted long before its 300 tokens
        assert concurrently(lambda: chat(client, {}).status_code) == [200]


def test_a_stalled_websocket_reader_is_closed_and_its_reply_interrupted():
    from app.chat.ws import CLOSE_TRY_AGAIN_LATER, _forward, _Socket

    class StalledSocket:
        closed_with: int | None = None

        async def send_text(self, text: str) -> None:
            await asyncio.sleep(3600)  # the client never reads: the send never completes

        async def close(self, code: int, reason: str = "") -> None:
            self.closed_with = code

    class Chat:
        stopped: list[tuple[str, str]] = []

        def stop(self, session_id: str, status: str = "stopped") -> bool:
            self.stopped.append((session_id, status))
            return True

    async def scenario() -> tuple[StalledSocket, Chat, float]:
        websocket, chat = StalledSocket(), Chat()
        reply = Reply("s1", "r1")
        for event in ({"type": "start"}, {"type": "delta", "text": "a"}, {"type": "done"}):
            reply.emit(event)
        started = time.monotonic()
        await asyncio.wait_for(_forward(_Socket(websocket, 0.2), chat, reply), timeout=5)
        return websocket, chat, time.monotonic() - started

    websocket, chat, elapsed = asyncio.run(scenario())
    assert websocket.closed_with == CLOSE_TRY_AGAIN_LATER
    assert chat.stopped == [("s1", "interrupted")]
    assert 0.2 <= elapsed < 1.0  # one timed-out send, then the remaining events are drained without sending


def vanish_before_the_first_event(client, path: str, body: dict) -> None:
    """Send a request straight into the app whose client is gone before the response starts: every send fails."""
    payload = json.dumps(body).encode()
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),  # an allowed host (tests' settings), as TestClient sends
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"authorization", b"Bearer sk-one"),
            (b"cookie", cookie.encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    pending = [{"type": "http.request", "body": payload, "more_body": False}]

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        raise OSError("the client is gone")

    async def run() -> None:
        with contextlib.suppress(Exception):
            await client.app(scope, receive, send)

    client.portal.call(run)


def test_a_client_gone_before_the_first_event_leaves_nothing_running(client):
    body = {"messages": HELLO, "max_tokens": 200, "ignore_eos": True, "stream": True}
    vanish_before_the_first_event(client, "/v1/chat/completions", body)
    one = {"authorization": "Bearer sk-one"}
    sid = client.post("/api/sessions", json={"settings": {"max_tokens": 200}}, headers=one).json()["id"]
    vanish_before_the_first_event(client, f"/api/sessions/{sid}/messages", {"content": "hello?"})
    state = wait_service_idle(client, timeout_s=5)
    assert (
        state["stats"]["num_generation_tokens_total"] < 300
    )  # both were aborted long before their 200 tokens
    stored = client.get(f"/api/sessions/{sid}/messages", headers=one).json()["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "interrupted")]
    assert client.app.state.services.admission.limiter.in_flight("key:" + _fp("sk-one")) == 0
