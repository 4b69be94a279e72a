"""SIGTERM with every kind of stream open on a real server: each client gets a final event saying why, and the
process exits within the grace period plus a few seconds.

/v1 streams (running and queued) end with an error chunk of type `server_shutdown` and `data: [DONE]`; session
streams with `done` (reason `shutdown`, the reply stored `interrupted`); WebSockets with that `done`, an error frame
`server_shutdown` and a 1001 close; the admin feed with a `shutdown` event.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.app.factories import make_tiny_model_dir
from tests.e2e.conftest import Server, server_env, start_server
from tests.faults import FAULTS_ENV

GRACE_S = 2
NUM_RUNNING_V1 = 5  # with 2 session streams and 1 socket reply: the 8 sequences the test server runs at once
NUM_QUEUED_V1 = 2


@pytest.fixture(scope="module")
def tiny_model() -> str:
    return str(make_tiny_model_dir())


class Stream(threading.Thread):
    """One client on a thread: `items` are what it received, `ended` how its connection ended."""

    def __init__(self, run: Callable[[Stream], None]) -> None:
        super().__init__(daemon=True)
        self.items: list[Any] = []
        self.opened = threading.Event()
        self.ended: str | None = None
        self.close_code: int | None = None
        self._run = run

    def run(self) -> None:
        try:
            self._run(self)
            self.ended = "complete"
        except ConnectionClosed as exc:
            self.ended, self.close_code = "closed", exc.rcvd.code if exc.rcvd else None
        except httpx.HTTPError as exc:
            self.ended = f"cut: {type(exc).__name__}"


def sse(method: str, url: str, body: dict[str, Any] | None = None, cookies: Any = None) -> Stream:
    def run(stream: Stream) -> None:
        origin = "/".join(url.split("/")[:3])  # cookie-authenticated writes carry their page's origin
        headers = {"Origin": origin}
        with httpx.stream(method, url, json=body, cookies=cookies, headers=headers, timeout=60) as response:
            assert response.status_code == 200, response.read()
            stream.opened.set()
            event = None
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    stream.items.append((event, line[5:].strip()))
                    event = None

    return Stream(run)


def socket(server: Server, sid: str, cookies: httpx.Cookies, content: str | None) -> Stream:
    def run(stream: Stream) -> None:
        header = {"Cookie": f"pagedchat_browser={cookies['pagedchat_browser']}"}
        with connect(f"{server.ws_url}/ws/sessions/{sid}", additional_headers=header) as ws:
            if content is not None:
                ws.send(json.dumps({"type": "message", "content": content}))
            stream.opened.set()
            while True:
                stream.items.append(json.loads(ws.recv(timeout=60)))

    return Stream(run)


def num_deltas(stream: Stream) -> int:
    return sum(1 for item in stream.items if "delta" in str(item))


def test_sigterm_ends_every_stream_with_its_final_event_within_the_grace_period(tmp_path, tiny_model):
    env = server_env(
        tmp_path, tiny_model, **{FAULTS_ENV: "step_delay_ms=25", "PAGEDCHAT_SHUTDOWN_GRACE_S": str(GRACE_S)}
    )
    server = start_server(tmp_path, env)
    http = httpx.Client(base_url=server.base_url, timeout=30, headers={"Origin": server.base_url})
    http.get("/")  # the browser cookie
    sids = [http.post("/api/sessions", json={"settings": {"max_tokens": 400}}).json()["id"] for _ in range(4)]
    v1_body = {
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    running_v1 = [
        sse("POST", server.base_url + "/v1/chat/completions", v1_body) for _ in range(NUM_RUNNING_V1)
    ]
    sessions = [
        sse("POST", f"{server.base_url}/api/sessions/{sid}/messages", {"content": "hi"}, http.cookies)
        for sid in sids[:2]
    ]
    replying, idle = (
        socket(server, sids[2], http.cookies, "hello"),
        socket(server, sids[3], http.cookies, None),
    )
    admin = sse("GET", server.base_url + "/api/admin/stream")
    busy = [*running_v1, *sessions, replying]
    for stream in [*busy, idle, admin]:
        stream.start()
    deadline = time.monotonic() + 60
    while any(num_deltas(s) < 2 for s in busy):
        assert time.monotonic() < deadline, [(s.ended, s.items[-2:]) for s in busy]
        time.sleep(0.02)
    queued_v1 = [sse("POST", server.base_url + "/v1/chat/completions", v1_body) for _ in range(NUM_QUEUED_V1)]
    for stream in queued_v1:
        stream.start()
    for stream in [*queued_v1, idle, admin]:
        assert stream.opened.wait(30)
    time.sleep(0.3)

    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=GRACE_S + 20)
    exited_s = time.monotonic() - signalled
    for stream in [*running_v1, *queued_v1, *sessions, replying, idle, admin]:
        stream.join(timeout=10)
    log = server.log()
    assert exited_s <= GRACE_S + 5, f"exited {exited_s:.1f} s after SIGTERM\n{log[-3000:]}"
    assert "Application shutdown complete." in log
    assert "ASGI callable returned without completing response" not in log, log[-3000:]
    assert "timeout graceful shutdown exceeded" not in log, log[-3000:]

    for stream in [*running_v1, *queued_v1]:  # an error chunk saying why, then [DONE]
        assert stream.ended == "complete", stream.ended
        *_, (_, last_chunk), (_, done) = stream.items
        assert done == "[DONE]"
        error = json.loads(last_chunk)["error"]
        assert (error["type"], error["code"]) == ("server_shutdown", "server_shutdown")
        assert error["message"].startswith("the server is shutting down")
    assert all(num_deltas(s) == 0 for s in queued_v1)  # they never started, and still hear why

    session_ends = []  # (session id, its done event, the reply's text as its client saw it)
    for sid, stream in zip(sids, sessions, strict=False):
        assert stream.ended == "complete" and stream.items[-1][0] == "done"
        events = [json.loads(data) for _, data in stream.items]
        session_ends.append((sid, events[-1], "".join(e.get("text", "") for e in events)))
    socket_text = "".join(frame.get("text", "") for frame in replying.items)
    session_ends.append((sids[2], replying.items[-2], socket_text))
    with sqlite3.connect(server.db_path) as db:
        for sid, done, text in session_ends:
            assert (done["type"], done["reason"], done["message"]["status"]) == (
                "done",
                "shutdown",
                "interrupted",
            )
            row = db.execute(
                "SELECT status, content FROM messages WHERE session_id = ? AND role = 'assistant'", (sid,)
            ).fetchone()
            assert row == ("interrupted", text) and text == done["message"]["content"] and text

    shutdown_frame = {
        "type": "error",
        "status": 503,
        "error_type": "server_shutdown",
        "code": "server_shutdown",
    }
    for stream in (replying, idle):  # the reply's done (if any), a frame saying why, then 1001
        assert (stream.ended, stream.close_code) == ("closed", 1001), (stream.ended, stream.items[-3:])
        assert {k: stream.items[-1][k] for k in shutdown_frame} == shutdown_frame
    assert replying.items[-2]["type"] == "done" and idle.items == [idle.items[-1]]

    assert admin.ended == "complete" and admin.items[-1][0] == "shutdown"
    assert json.loads(admin.items[-1][1])["reason"] == "shutdown"
