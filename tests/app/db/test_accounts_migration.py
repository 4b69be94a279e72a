"""The accounts migration on a database made by the previous schema (SQLite and PostgreSQL): its cookie-owned chats
stay, and stay readable by their browser under `--auth none` (the default)."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from app.db.database import alembic_config, create_db_engine
from app.http.security import make_signer
from tests.app.databases import TestDatabase, make_test_database
from tests.app.factories import make_client

NOW = "2026-01-01 00:00:00"
INSERT_USER = text(
    "INSERT INTO users (id, username, role, created_at, disabled) VALUES (:id, :name, :role, :now, false)"
)


def make_previous_database(db: TestDatabase) -> str:
    """A database at the previous head holding one chat of browser `b1` (a user turn and its reply)."""
    command.upgrade(alembic_config(db.url), "0002")
    db.raw(
        "INSERT INTO chat_sessions VALUES ('s1', 'browser:b1', 'old chat', '', '{}', :now, :now)",
        {"now": NOW},
    )
    for position, role, content, status in (
        (0, "user", "hi", "complete"),
        (1, "assistant", "hello", "finished"),
    ):
        db.raw(
            "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
            "VALUES ('s1', :position, :role, :content, :status, :now, :now)",
            dict(position=position, role=role, content=content, status=status, now=NOW),
        )
    return db.url


def test_the_upgrade_adds_the_account_tables_and_keeps_the_chats(empty_db: TestDatabase) -> None:
    url = make_previous_database(empty_db)
    command.upgrade(alembic_config(url), "head")
    engine = create_db_engine(url)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT id, owner, title FROM chat_sessions")).all() == [
            ("s1", "browser:b1", "old chat")
        ]
        assert conn.execute(text("SELECT count(*) FROM messages")).scalar() == 2
        conn.execute(INSERT_USER, dict(id="u1", name="alice", role="admin", now=NOW))
    for user_id, name, role in (
        ("u2", "alice", "user"),
        ("u3", "bob", "root"),
    ):  # a taken name; an unknown role
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(INSERT_USER, dict(id=user_id, name=name, role=role, now=NOW))
    with (
        pytest.raises(IntegrityError),
        engine.begin() as conn,
    ):  # a sign-in of no account (SQLite: foreign_keys=ON)
        conn.execute(
            text("INSERT INTO user_sessions VALUES ('h', 'nobody', '127.0.0.1', :now, :now, NULL)"),
            {"now": NOW},
        )
    engine.dispose()
    command.downgrade(alembic_config(url), "0002")
    assert empty_db.tables() == {"alembic_version", "admin_sessions", "chat_sessions", "messages"}
    assert empty_db.raw("SELECT owner FROM chat_sessions") == [("browser:b1",)]


# SQLite only: this is about the routes reading migrated chats, which the test above checks on both databases
def test_cookie_owned_chats_stay_readable_without_accounts(tmp_path: Path) -> None:
    # make_client's database; its start migrates it to head
    make_previous_database(make_test_database("sqlite", tmp_path / "chat.db", None, None))
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


INSERT_KEY = text(
    "INSERT INTO api_keys (id, user_id, name, prefix, secret_hash, created_at) "
    "VALUES (:id, :user_id, 'ci', 'pck_abcdefgh', :hash, :now)"
)


def test_0007_adds_api_keys_that_go_with_their_account_and_keeps_the_invites(empty_db: TestDatabase) -> None:
    cfg = alembic_config(empty_db.url)
    command.upgrade(cfg, "0006")
    empty_db.raw(INSERT_USER.text, dict(id="u1", name="alice", role="admin", now=NOW))
    empty_db.raw(
        "INSERT INTO invites (id, username, role, created_by, created_at, expires_at) "
        "VALUES ('h1', 'bob', 'user', 'u1', :now, :now)",
        {"now": NOW},
    )
    command.upgrade(cfg, "head")
    assert empty_db.raw("SELECT id, created_by FROM invites") == [("h1", "u1")]
    engine = create_db_engine(empty_db.url)
    with engine.begin() as conn:
        conn.execute(INSERT_KEY, dict(id="k1", user_id="u1", hash="a" * 64, now=NOW))
    for key_id, user_id, secret_hash in (("k2", "u1", "a" * 64), ("k3", "nobody", "b" * 64)):
        with pytest.raises(IntegrityError), engine.begin() as conn:  # a hash twice; a key of no account
            conn.execute(INSERT_KEY, dict(id=key_id, user_id=user_id, hash=secret_hash, now=NOW))
    with engine.begin() as conn:  # a deleted account's keys go with it (SQLite: foreign_keys=ON)
        conn.execute(text("DELETE FROM users WHERE id = 'u1'"))
        assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar() == 0
        assert conn.execute(text("SELECT created_by FROM invites")).all() == [(None,)]
    engine.dispose()
    command.downgrade(cfg, "0006")
    assert "api_keys" not in empty_db.tables()
    assert empty_db.raw("SELECT id FROM invites") == [("h1",)]
