"""`pagedchat serve` on PostgreSQL: the server migrates an empty database, stores a chat turn made over the session
API, finds it with /api/search, and keeps it in PostgreSQL (not in a SQLite file)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from bench.common.servers import stop_server
from tests.app.factories import sse_events
from tests.e2e.conftest import server_env, start_server

M0, M1 = "\x02", "\x03"


def test_a_chat_turn_and_a_search_on_postgresql(postgres, tmp_path: Path, tiny_model: str) -> None:
    name = postgres.create_database()  # empty: the server's start migrates it
    server = start_server(tmp_path, server_env(tmp_path, tiny_model), database_url=postgres.url(name))
    try:
        with httpx.Client(base_url=server.base_url, timeout=30, headers={"origin": server.base_url}) as http:
            sid = http.post(
                "/api/sessions", json={"title": "Lights", "settings": {"temperature": 0, "max_tokens": 5}}
            ).json()["id"]
            with http.stream(
                "POST", f"/api/sessions/{sid}/messages", json={"content": "What do lighthouse keepers eat?"}
            ) as response:
                assert response.status_code == 200
                events = [json.loads(e["data"]) for e in sse_events(response.iter_lines())]
            assert events, "no events streamed"
            messages = http.get(f"/api/sessions/{sid}").json()["messages"]
            assert [(m["role"], m["status"]) for m in messages] == [
                ("user", "complete"),
                ("assistant", "finished"),
            ]

            found = http.get("/api/search", params={"q": "lighthouse keeper"}).json()
            assert [(r["session_id"], r["title"], r["role"], r["snippet"]) for r in found["results"]] == [
                (sid, "Lights", "user", f"What do {M0}lighthouse{M1} {M0}keepers{M1} eat?")
            ]
            assert http.get("/api/search", params={"q": "lighthouse OR"}).json()["results"] == []
            bad = http.get("/api/search", params={"q": "!& :*"})
            assert bad.status_code == 400 and "holds no word" in bad.json()["error"]["message"]
            assert http.get("/health").json()["status"] == "ok"
        rows = postgres.query(name, "SELECT role, status FROM messages ORDER BY position")
        assert rows == [
            ("user", "complete"),
            ("assistant", "finished"),
        ]  # in PostgreSQL, not in a SQLite file
        assert not (tmp_path / "chat.db").exists() and not (tmp_path / "cache" / "pagedchat.db").exists()
    finally:
        stop_server(server)
        postgres.drop_database(name)
    assert "Application shutdown complete." in server.log(), server.log()[-4000:]
