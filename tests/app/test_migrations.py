"""Alembic migrations: empty database to head, models match the migrations, downgrade and upgrade again, 0001 to
0002 (admin sign-ins) and 0002 to 0003 (presets) on a database that holds chats."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

from app.db.database import (
    alembic_config,
    create_db_engine,
    include_in_autogenerate,
    migrations_dir,
    upgrade_to_head,
)
from app.db.models import Base

TABLES = [
    "admin_sessions",
    "alembic_version",
    "chat_sessions",
    "invites",
    "messages",
    "presets",
    "user_sessions",
    "users",
]
# migration 0006's FTS5 index over messages and the shadow tables SQLite keeps its data in
SEARCH_TABLES = [
    "messages_fts",
    "messages_fts_config",
    "messages_fts_data",
    "messages_fts_docsize",
    "messages_fts_idx",
]


def make_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'm.db'}"


def test_migrations_folder_is_found_with_a_single_head() -> None:
    path = migrations_dir()
    assert path == Path(__file__).resolve().parents[2] / "migrations"
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert script.get_heads() == ["0006"]
    assert [rev.revision for rev in script.walk_revisions()] == [
        "0006",
        "0005",
        "0004",
        "0003",
        "0002",
        "0001",
    ]


def test_upgrade_from_empty_to_head_creates_the_schema(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    assert inspect(engine).get_table_names() == []
    upgrade_to_head(engine)
    upgrade_to_head(engine)  # a second start is a no-op
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == sorted(TABLES + SEARCH_TABLES)
    assert [c["name"] for c in insp.get_columns("messages")] == [
        c.name for c in Base.metadata.tables["messages"].c
    ]
    assert insp.get_foreign_keys("messages")[0]["options"] == {"ondelete": "CASCADE"}
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == "0006"
    engine.dispose()


def test_models_match_the_migrations(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    upgrade_to_head(engine)
    with engine.connect() as conn:
        opts = {"compare_type": True, "include_name": include_in_autogenerate}
        diffs = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert diffs == []
    engine.dispose()
    command.check(
        alembic_config(make_db(tmp_path))
    )  # `alembic check`: raises when autogenerate finds changes


def test_compare_metadata_does_notice_a_drift(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    upgrade_to_head(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_chat_sessions_owner_updated_at")
    with engine.connect() as conn:
        opts = {"include_name": include_in_autogenerate}
        diffs = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert [d[0] for d in diffs] == ["add_index"]
    engine.dispose()


def test_downgrade_to_base_and_upgrade_again(tmp_path: Path) -> None:
    cfg = alembic_config(make_db(tmp_path))
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    conn = sqlite3.connect(tmp_path / "m.db")
    assert conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall() == [
        ("alembic_version",)
    ]
    conn.close()
    command.upgrade(cfg, "head")
    engine = create_db_engine(make_db(tmp_path))
    assert sorted(inspect(engine).get_table_names()) == sorted(TABLES + SEARCH_TABLES)
    engine.dispose()


def test_migrated_constraints_reject_bad_rows(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    upgrade_to_head(engine)
    now = "2026-01-01 00:00:00"
    insert_message = (
        "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
        "VALUES (?, ?, ?, '', ?, ?, ?)"
    )
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO chat_sessions (id, owner, title, system_prompt, settings, created_at, updated_at) "
            "VALUES ('s1', 'alice', 't', '', '{}', ?, ?)",
            (now, now),
        )
        conn.exec_driver_sql(insert_message, ("s1", 0, "user", "complete", now, now))
    bad_rows = [
        ("s1", 1, "tool", "complete", now, now),  # unknown role
        ("s1", 1, "assistant", "done", now, now),  # unknown status
        ("s1", 0, "user", "complete", now, now),  # duplicate position
        ("nope", 0, "user", "complete", now, now),  # no such session (foreign_keys=ON)
    ]
    for row in bad_rows:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(insert_message, row)
    engine.dispose()


def test_0002_adds_admin_sessions_to_a_database_with_chats_and_goes_back(tmp_path: Path) -> None:
    cfg = alembic_config(make_db(tmp_path))
    command.upgrade(cfg, "0001")
    now = "2026-01-01 00:00:00"
    with sqlite3.connect(tmp_path / "m.db") as conn:
        conn.execute("INSERT INTO chat_sessions VALUES ('s1', 'alice', 't', '', '{}', ?, ?)", (now, now))
    command.upgrade(cfg, "head")
    engine = create_db_engine(make_db(tmp_path))
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == sorted(TABLES + SEARCH_TABLES)
    assert [(c["name"], c["nullable"]) for c in insp.get_columns("admin_sessions")] == [
        ("id", False),
        ("token_fingerprint", False),
        ("client", False),
        ("created_at", False),
        ("expires_at", False),
        ("revoked_at", True),
    ]
    assert insp.get_pk_constraint("admin_sessions") == {
        "constrained_columns": ["id"],
        "name": "pk_admin_sessions",
    }
    insert = "INSERT INTO admin_sessions (id, token_fingerprint, client, created_at, expires_at) VALUES (?, ?, ?, ?, ?)"
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT owner FROM chat_sessions").all() == [("alice",)]  # the chats stay
        conn.exec_driver_sql(insert, ("h1", "f1", "127.0.0.1", now, now))
    for row in [
        ("h1", "f1", "127.0.0.1", now, now),
        ("h2", None, "127.0.0.1", now, now),
    ]:  # duplicate; no token
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(insert, row)
    engine.dispose()
    command.downgrade(cfg, "0001")
    with sqlite3.connect(tmp_path / "m.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"alembic_version", "chat_sessions", "messages"}
        assert conn.execute("SELECT owner FROM chat_sessions").fetchall() == [("alice",)]


def test_0003_adds_presets_in_place_and_going_back_keeps_every_chat_and_message(tmp_path: Path) -> None:
    cfg = alembic_config(make_db(tmp_path))
    command.upgrade(cfg, "0002")
    now = "2026-01-01 00:00:00"
    with sqlite3.connect(tmp_path / "m.db") as conn:
        conn.execute("INSERT INTO chat_sessions VALUES ('s1', 'alice', 't', '', '{}', ?, ?)", (now, now))
        conn.execute(
            "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
            "VALUES ('s1', 0, 'user', 'hi', 'complete', ?, ?)",
            (now, now),
        )
    command.upgrade(cfg, "0003")
    engine = create_db_engine(make_db(tmp_path))  # foreign keys on, as the app runs
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == [
        "admin_sessions",
        "alembic_version",
        "chat_sessions",
        "messages",
        "presets",
    ]
    assert [(c["name"], c["nullable"]) for c in insp.get_columns("chat_sessions")][-1] == ("preset_id", True)
    assert [(c["name"], c["nullable"]) for c in insp.get_columns("presets")] == [
        ("id", False),
        ("owner", False),
        ("name", False),
        ("system_prompt", False),
        ("settings", False),
        ("is_default", False),
        ("created_at", False),
        ("updated_at", False),
    ]
    insert = "INSERT INTO presets VALUES (?, ?, ?, '', '{}', ?, ?, ?)"
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT id, preset_id FROM chat_sessions").all() == [("s1", None)]
        conn.exec_driver_sql(insert, ("p1", "alice", "Terse", True, now, now))
        conn.exec_driver_sql(insert, ("p2", "alice", "Long", False, now, now))
        conn.exec_driver_sql(insert, ("p3", "bob", "Terse", True, now, now))  # names and defaults per owner
        conn.exec_driver_sql("UPDATE chat_sessions SET preset_id = 'p1'")
    for row in [
        ("p4", "alice", "Terse", False, now, now),  # a name the owner already has
        ("p5", "alice", "Other", True, now, now),  # a second default of one owner
    ]:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql(insert, row)
    engine.dispose()
    command.downgrade(cfg, "0002")  # in place: no table copy, whose drop would cascade to the messages
    with sqlite3.connect(tmp_path / "m.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"admin_sessions", "alembic_version", "chat_sessions", "messages"}
        assert conn.execute("SELECT * FROM chat_sessions").fetchall() == [
            ("s1", "alice", "t", "", "{}", now, now)
        ]
        assert conn.execute("SELECT session_id, content FROM messages").fetchall() == [("s1", "hi")]
