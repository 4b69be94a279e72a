"""Restarting on the same database keeps every session and message; a kill -9 mid-reply loses at most a flush."""

from __future__ import annotations

import json
import signal
import sqlite3
import time

import httpx

from bench.common.servers import stop_server
from tests.app.factories import sse_events


def reply(http: httpx.Client, sid: str, content: str) -> list[dict]:
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as response:
        assert response.status_code == 200
        return [json.loads(e["data"]) for e in sse_events(response.iter_lines())]


def test_restart_keeps_everything_and_kill_9_loses_at_most_the_last_flush(server_factory):
    # phase 1: a conversation, then a graceful stop (SIGTERM)
    first = server_factory(PAGEDCHAT_MAX_MODEL_LEN="1024")
    with httpx.Client(base_url=first.base_url, timeout=30, headers={"origin": first.base_url}) as http:
        sid = http.post(
            "/api/sessions",
            json={
                "title": "kept",
                "system_prompt": "Be terse.",
                "settings": {"temperature": 0, "max_tokens": 6},
            },
        ).json()["id"]
        reply(http, sid, "one")
        reply(http, sid, "two")
        before = http.get(f"/api/sessions/{sid}").json()
        cookies = dict(http.cookies)
    stop_server(first)
    assert "Application shutdown complete." in first.log()

    # phase 2: same directory, so the same database and the same persisted cookie secret
    second = server_factory(PAGEDCHAT_MAX_MODEL_LEN="1024")
    with (
        httpx.Client(
            base_url=second.base_url, timeout=30, cookies=cookies, headers={"origin": second.base_url}
        ) as http,
        httpx.Client(base_url=second.base_url, timeout=30, cookies=cookies) as watcher,
    ):
        assert http.get(f"/api/sessions/{sid}").json() == before
        assert [m["status"] for m in before["messages"]] == ["complete", "finished", "complete", "finished"]
        events = reply(http, sid, "three")
        assert events[0]["exact_extension"] is True  # stored token ids still extend exactly after the restart
        assert events[-1]["message"]["status"] == "finished"
        # then a long reply, killed with SIGKILL once part of it has been flushed
        http.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 0, "max_tokens": 500}})
        with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Never stop"}) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("event: delta"):
                pass
            partial = wait_for_flushed_partial(watcher, sid)
            second.process.send_signal(signal.SIGKILL)
            second.process.wait(timeout=10)
    with sqlite3.connect(second.db_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    # phase 3: every message is there; the killed reply is kept as interrupted; the chat goes on
    third = server_factory(PAGEDCHAT_MAX_MODEL_LEN="1024")
    with httpx.Client(
        base_url=third.base_url, timeout=30, cookies=cookies, headers={"origin": third.base_url}
    ) as http:
        stored = http.get(f"/api/sessions/{sid}/messages").json()["messages"]
        assert stored[:6] == http.get(f"/api/sessions/{sid}").json()["messages"][:6]
        assert [(m["role"], m["status"]) for m in stored[6:]] == [
            ("user", "complete"),
            ("assistant", "interrupted"),
        ]
        assert stored[6]["content"] == "Never stop"
        assert stored[7]["content"].startswith(partial)
        http.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 0, "max_tokens": 4}})
        assert reply(http, sid, "Are you back?")[-1]["message"]["status"] == "finished"
        assert len(http.get(f"/api/sessions/{sid}/messages").json()["messages"]) == 10


def wait_for_flushed_partial(watcher: httpx.Client, sid: str, timeout_s: float = 10.0) -> str:
    """Poll until the streaming assistant row holds some flushed text; return that text."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = watcher.get(f"/api/sessions/{sid}/messages").json()["messages"][-1]
        if last["role"] == "assistant" and last["status"] == "streaming" and last["content"]:
            return last["content"]
        assert last["status"] in ("complete", "streaming"), f"the reply ended before it was killed: {last}"
        time.sleep(0.01)
    raise AssertionError("the partial reply was never flushed")
