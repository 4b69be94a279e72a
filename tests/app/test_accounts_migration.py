"""The accounts migration on a database made by the previous schema: its cookie-owned chats stay, and stay readable
by their browser under `--auth none` (the default)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.exc import IntegrityError

from app.db.database import alembic_config, create_db_engine
from app.routes.security import make_signer
from tests.app.factories import make_client

NOW = "2026-01-01 00:00:00"
INSERT_USER = "INSERT INTO users (id, username, role, created_at, disabled) VALUES (?, ?, ?, ?, 0)"


def make_previous_database(path: Path) -> str:
    """A database at the previous head holding one chat of browser `b1` (a user turn and its reply)."""
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "0002")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO chat_sessions VALUES ('s1', 'browser:b1', 'old chat', '', '{}', ?, ?)", (NOW, NOW)
        )
        for position, role, content, status in (
            (0, "user", "hi", "complete"),
            (1, "assistant", "hello", "finished"),
        ):
            conn.execute(
                "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
                "VALUES ('s1', ?, ?, ?, ?, ?, ?)",
                (position, role, content, status, NOW, NOW),
            )
    return url


def test_the_upgrade_adds_the_account_tables_and_keeps_the_chats(tmp_path: Path) -> None:
    url = make_previous_database(tmp_path / "chat.db")
    command.upgrade(alembic_config(url), "head")
    engine = create_db_engine(url)
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT id, owner, title FROM chat_sessions").all() == [
            ("s1", "browser:b1", "old chat")
        ]
        assert conn.exec_driver_sql("SELECT count(*) FROM messages").scalar() == 2
        conn.exec_driver_sql(INSERT_USER, ("u1", "alice", "admin", NOW))
    for row in (("u2", "alice", "user", NOW), ("u3", "bob", "root", NOW)):  # a taken name; an unknown role
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(INSERT_USER, row)
    with pytest.raises(IntegrityError), engine.begin() as conn:  # a sign-in of no account (foreign_keys=ON)
        conn.exec_driver_sql(
            "INSERT INTO user_sessions VALUES ('h', 'nobody', '127.0.0.1', ?, ?, NULL)", (NOW, NOW)
        )
    engine.dispose()
    command.downgrade(alembic_config(url), "0002")
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"alembic_version", "admin_sessions", "chat_sessions", "messages"}
        assert conn.execute("SELECT owner FROM chat_sessions").fetchall() == [("browser:b1",)]


def test_cookie_owned_chats_stay_readable_without_accounts(tmp_path: Path) -> None:
    make_previous_database(tmp_path / "chat.db")  # make_client's database; its start migrates it to head
    with make_client(tmp_path) as client:
        # the browser's cookie from before the upgrade
        cookie = make_signer("test-secret").sign("b1").decode()
        client.cookies.set("pagedchat_browser", cookie)
        assert [s["title"] for s in client.get("/api/sessions").json()["sessions"]] == ["old chat"]
        chat = client.get("/api/sessions/s1").json()
        assert [(m["role"], m["content"]) for m in chat["messages"]] == [
            ("user", "hi"),
            ("assistant", "hello"),
        ]
        assert client.get("/").status_code == 200  # no sign-in page without accounts
