"""The database busy (another writer holds the lock) or unavailable (every call fails) while a reply streams.

Requests that need the database get a clear 503; /v1 keeps serving; the reply already streaming goes on untouched
and is stored whole once the database is back.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import exc as sa_exc

from tests.app.factories import make_client, sse_events
from tests.faults import FaultPlan
from tests.reliability.helpers import HELLO, wait_service_idle

OUTAGE_S = 0.6


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("db"),
        db_busy_timeout_ms=100,
        store_retry_s=20.0,
        faults=FaultPlan(step_delay_s=0.015),  # a slow engine: the reply outlasts the outage
    ) as c:
        yield c


@contextlib.contextmanager
def busy(db_path: str) -> Iterator[None]:
    """Another connection holds the write lock (SQLite WAL: readers still read, writers time out)."""
    locker = sqlite3.connect(db_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


class _Down:
    """Stands in for the store's engine and session factory: every database call fails like a lost disk."""

    def _fail(self, *args, **kwargs):
        raise sa_exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("disk I/O error"))

    begin = connect = _fail


@contextlib.contextmanager
def unavailable(store) -> Iterator[None]:
    saved = store._engine, store._sessions
    store._engine = store._sessions = _Down()
    try:
        yield
    finally:
        store._engine, store._sessions = saved


def stream_reply(client, sid: str, content: str, events: list[tuple[float, dict]]) -> None:
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as response:
        assert response.status_code == 200
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if line == "":
                parsed = sse_events(lines)
                lines = []
                if parsed:
                    events.append((time.monotonic(), json.loads(parsed[-1]["data"])))


@pytest.mark.parametrize("kind", ["busy", "unavailable"])
def test_outage_gives_503_and_the_streaming_reply_survives_whole(client, kind):
    svc = client.app.state.services
    sid = client.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 120}}).json()["id"]
    events: list[tuple[float, dict]] = []
    reader = threading.Thread(target=stream_reply, args=(client, sid, "Tell me everything", events))
    reader.start()
    deadline = time.monotonic() + 10
    while sum(e["type"] == "delta" for _, e in events) < 3:
        assert time.monotonic() < deadline, events
        time.sleep(0.01)
    outage = busy(svc.store.url.removeprefix("sqlite:///")) if kind == "busy" else unavailable(svc.store)
    with outage:
        began = time.monotonic()
        created = client.post("/api/sessions", json={"title": "during the outage"})
        assert created.status_code == 503
        assert created.headers["retry-after"] == "2"
        error = created.json()["error"]
        assert error["code"] == "database_unavailable"
        cause = "database is locked" if kind == "busy" else "disk I/O error"
        assert error["message"].startswith("the database is unavailable: database unavailable (sqlite:///")
        assert error["message"].endswith(cause)
        listed = client.get("/api/sessions")
        assert listed.status_code == (
            200 if kind == "busy" else 503
        )  # WAL readers are not blocked by a writer
        assert (
            client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 3}).status_code == 200
        )
        if kind == "unavailable":
            assert client.get("/health").json()["database"] == "unavailable"
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        ended = time.monotonic()
    reader.join(timeout=60)
    assert not reader.is_alive()
    during = [e for t, e in events if began <= t <= ended]
    assert sum(e["type"] == "delta" for e in during) >= 3, "the reply stalled during the outage"
    done = events[-1][1]
    text = "".join(e["text"] for _, e in events if e["type"] == "delta")
    assert (done["type"], done["message"]["status"], done["message"]["error"]) == ("done", "finished", None)
    assert done["message"]["content"] == text
    assert done["usage"]["completion_tokens"] == 120
    stored = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "finished")]
    assert stored[1]["content"] == text
    assert stored[1]["id"] == done["message"]["id"]
    wait_service_idle(client)


def test_reads_never_wait_behind_a_write_waiting_for_the_lock(tmp_path):
    with make_client(tmp_path, db_busy_timeout_ms=3000) as client:
        sid = client.post("/api/sessions", json={"title": "before"}).json()["id"]
        writes: list[int] = []
        with busy(client.app.state.services.store.url.removeprefix("sqlite:///")):
            writer = threading.Thread(target=lambda: writes.append(client.post("/api/sessions").status_code))
            writer.start()
            time.sleep(0.2)  # the write now waits for the lock, up to 3 s
            began = time.monotonic()
            health = client.get("/health")
            listed = client.get("/api/sessions")
            session = client.get(f"/api/sessions/{sid}")
            took = time.monotonic() - began
            # done while the write still waits for the lock (it gives up after 3 s): not queued behind it. The
            # order, not a time bound, so a busy machine cannot fail it (it took 1.1 s once under two workers)
            write_still_waiting = writer.is_alive()
            writer.join()
        assert write_still_waiting, (
            f"reads took {took:.2f} s and ended after the write gave up: they waited behind it"
        )
        assert (health.status_code, health.json()["database"]) == (200, "ok")
        assert [s["id"] for s in listed.json()["sessions"]] == [sid]
        assert session.json()["title"] == "before"
        assert writes == [503]  # the write itself timed out on the lock
