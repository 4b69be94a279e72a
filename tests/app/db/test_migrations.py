"""Alembic migrations, on SQLite and on PostgreSQL: empty database to head, models match the migrations, downgrade and
upgrade again, 0001 to 0002 (admin sign-ins) and 0002 to 0003 (presets) on a database that holds chats.

Every test here runs on both databases: none is about SQLite's way of altering a table (copying it), since no
migration copies a table (0003 and 0005 alter in place, so that SQLite's drop of an old copy cannot cascade to the
messages); what each leaves behind is checked on both."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from app.db.database import (
    PG_MIGRATION_LOCK,
    alembic_config,
    create_db_engine,
    include_in_autogenerate,
    migrations_dir,
    upgrade_to_head,
)
from app.db.models import Base
from tests.app.databases import TestDatabase

TABLES = [
    "admin_sessions",
    "api_keys",
    "alembic_version",
    "chat_sessions",
    "invites",
    "messages",
    "presets",
    "system_prompt_changes",
    "user_sessions",
    "users",
]
# migration 0006's FTS5 index over messages and the shadow tables SQLite keeps its data in; 0008's owner numbers
SEARCH_TABLES = [
    "search_owners",
    "messages_fts",
    "messages_fts_config",
    "messages_fts_data",
    "messages_fts_docsize",
    "messages_fts_idx",
]
NOW = "2026-01-01 00:00:00"
NOW_READ = {
    "sqlite": NOW,
    "postgresql": datetime(2026, 1, 1, tzinfo=timezone.utc),
}  # as a raw SELECT returns it


def head_tables(db: TestDatabase) -> list[str]:
    """The tables at head: PostgreSQL keeps its search index in a column of messages."""
    return sorted(TABLES + SEARCH_TABLES) if db.is_sqlite else sorted(TABLES)


def test_migrations_folder_is_found_with_a_single_head() -> None:
    path = migrations_dir()
    assert path == Path(__file__).resolve().parents[3] / "migrations"
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert script.get_heads() == ["0009"]
    assert [rev.revision for rev in script.walk_revisions()] == [
        "0009",
        "0008",
        "0007",
        "0006",
        "0005",
        "0004",
        "0003",
        "0002",
        "0001",
    ]


def test_upgrade_from_empty_to_head_creates_the_schema(empty_db: TestDatabase) -> None:
    engine = create_db_engine(empty_db.url)
    assert inspect(engine).get_table_names() == []
    upgrade_to_head(engine)
    upgrade_to_head(engine)  # a second start is a no-op
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == head_tables(empty_db)
    search_column = ["search_key"] if empty_db.is_sqlite else ["search_vector"]
    assert [c["name"] for c in insp.get_columns("messages")] == [
        c.name for c in Base.metadata.tables["messages"].c
    ] + search_column
    assert [fk["options"] for fk in insp.get_foreign_keys("messages")] == [{"ondelete": "CASCADE"}] * 2
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == "0009"
    engine.dispose()


def test_models_match_the_migrations(empty_db: TestDatabase) -> None:
    engine = create_db_engine(empty_db.url)
    upgrade_to_head(engine)
    with engine.connect() as conn:
        opts = {"compare_type": True, "include_name": include_in_autogenerate}
        diffs = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert diffs == []
    engine.dispose()
    command.check(alembic_config(empty_db.url))  # `alembic check`: raises when autogenerate finds changes


def test_compare_metadata_does_notice_a_drift(empty_db: TestDatabase) -> None:
    engine = create_db_engine(empty_db.url)
    upgrade_to_head(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_chat_sessions_owner_updated_at")
    with engine.connect() as conn:
        opts = {"include_name": include_in_autogenerate}
        diffs = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert [d[0] for d in diffs] == ["add_index"]
    engine.dispose()


def test_downgrade_to_base_and_upgrade_again(empty_db: TestDatabase) -> None:
    cfg = alembic_config(empty_db.url)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    assert empty_db.tables() == {"alembic_version"}
    if not empty_db.is_sqlite:  # the search configuration went too
        assert empty_db.raw("SELECT count(*) FROM pg_ts_config WHERE cfgname LIKE 'pagedchat%'") == [(0,)]
    command.upgrade(cfg, "head")
    assert sorted(empty_db.tables()) == head_tables(empty_db)


def test_migrated_constraints_reject_bad_rows(empty_db: TestDatabase) -> None:
    engine = create_db_engine(empty_db.url)
    upgrade_to_head(engine)
    insert_message = text(
        "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
        "VALUES (:sid, :position, :role, '', :status, :now, :now)"
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO chat_sessions (id, owner, title, system_prompt, settings, created_at, updated_at) "
                "VALUES ('s1', 'alice', 't', '', '{}', :now, :now)"
            ),
            {"now": NOW},
        )
        conn.execute(insert_message, dict(sid="s1", position=0, role="user", status="complete", now=NOW))
    bad_rows = [
        ("s1", 1, "tool", "complete"),  # unknown role
        ("s1", 1, "assistant", "done"),  # unknown status
        ("s1", 0, "user", "complete"),  # duplicate position
        ("nope", 0, "user", "complete"),  # no such session (SQLite: foreign_keys=ON)
    ]
    for sid, position, role, status in bad_rows:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert_message, dict(sid=sid, position=position, role=role, status=status, now=NOW))
    engine.dispose()


def test_0002_adds_admin_sessions_to_a_database_with_chats_and_goes_back(empty_db: TestDatabase) -> None:
    db = empty_db
    cfg = alembic_config(db.url)
    command.upgrade(cfg, "0001")
    db.raw("INSERT INTO chat_sessions VALUES ('s1', 'alice', 't', '', '{}', :now, :now)", {"now": NOW})
    command.upgrade(cfg, "head")
    engine = create_db_engine(db.url)
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == head_tables(db)
    assert [(c["name"], c["nullable"]) for c in insp.get_columns("admin_sessions")] == [
        ("id", False),
        ("token_fingerprint", False),
        ("client", False),
        ("created_at", False),
        ("expires_at", False),
        ("revoked_at", True),
    ]
    pk = insp.get_pk_constraint("admin_sessions")
    assert (pk["constrained_columns"], pk["name"]) == (["id"], "pk_admin_sessions")
    insert = text(
        "INSERT INTO admin_sessions (id, token_fingerprint, client, created_at, expires_at) "
        "VALUES (:id, :fingerprint, '127.0.0.1', :now, :now)"
    )
    with engine.begin() as conn:
        assert conn.execute(text("SELECT owner FROM chat_sessions")).all() == [("alice",)]  # the chats stay
        conn.execute(insert, {"id": "h1", "fingerprint": "f1", "now": NOW})
    for session_id, fingerprint in [("h1", "f1"), ("h2", None)]:  # duplicate; no token
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert, {"id": session_id, "fingerprint": fingerprint, "now": NOW})
    engine.dispose()
    command.downgrade(cfg, "0001")
    assert db.tables() == {"alembic_version", "chat_sessions", "messages"}
    assert db.raw("SELECT owner FROM chat_sessions") == [("alice",)]


def test_0003_adds_presets_in_place_and_going_back_keeps_every_chat_and_message(
    empty_db: TestDatabase,
) -> None:
    db = empty_db
    cfg = alembic_config(db.url)
    command.upgrade(cfg, "0002")
    db.raw("INSERT INTO chat_sessions VALUES ('s1', 'alice', 't', '', '{}', :now, :now)", {"now": NOW})
    db.raw(
        "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
        "VALUES ('s1', 0, 'user', 'hi', 'complete', :now, :now)",
        {"now": NOW},
    )
    command.upgrade(cfg, "0003")
    engine = create_db_engine(db.url)  # SQLite: foreign keys on, as the app runs
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
    insert = text("INSERT INTO presets VALUES (:id, :owner, :name, '', '{}', :is_default, :now, :now)")

    def preset(id_: str, owner: str, name: str, is_default: bool) -> dict[str, object]:
        return {"id": id_, "owner": owner, "name": name, "is_default": is_default, "now": NOW}

    with engine.begin() as conn:
        assert conn.execute(text("SELECT id, preset_id FROM chat_sessions")).all() == [("s1", None)]
        conn.execute(insert, preset("p1", "alice", "Terse", True))
        conn.execute(insert, preset("p2", "alice", "Long", False))
        conn.execute(insert, preset("p3", "bob", "Terse", True))  # names and defaults per owner
        conn.execute(text("UPDATE chat_sessions SET preset_id = 'p1'"))
    for row in [
        preset("p4", "alice", "Terse", False),  # a name the owner already has
        preset("p5", "alice", "Other", True),  # a second default of one owner
    ]:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert, row)
    engine.dispose()
    command.downgrade(cfg, "0002")  # in place: no table copy, whose drop would cascade to the messages
    assert db.tables() == {"admin_sessions", "alembic_version", "chat_sessions", "messages"}
    now, settings = NOW_READ[db.backend], "{}" if db.is_sqlite else {}
    assert db.raw("SELECT * FROM chat_sessions") == [("s1", "alice", "t", "", settings, now, now)]
    assert db.raw("SELECT session_id, content FROM messages") == [("s1", "hi")]


MIGRATE = "import sys; from app.db.database import *; upgrade_to_head(create_db_engine(sys.argv[1]))"


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_a_process_migrating_postgresql_waits_for_the_one_already_migrating(empty_db: TestDatabase) -> None:
    holder = empty_db.engine().connect()  # as if another process were migrating: it holds the migration lock
    holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_MIGRATION_LOCK})
    holder.commit()
    process = subprocess.Popen(
        [sys.executable, "-c", MIGRATE, empty_db.url], stderr=subprocess.PIPE, text=True
    )
    try:
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = :key"
        deadline = time.monotonic() + 60
        while empty_db.raw(waiting, {"key": PG_MIGRATION_LOCK}) != [(1,)]:
            assert process.poll() is None, f"it migrated without waiting: {process.stderr.read()}"
            assert time.monotonic() < deadline, "the process never waited for the migration lock"
            time.sleep(0.05)
        assert empty_db.tables() == set()  # nothing migrated while it waits
    finally:
        holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_MIGRATION_LOCK})
        holder.close()
    assert process.wait(timeout=60) == 0, process.stderr.read()
    assert empty_db.raw("SELECT version_num FROM alembic_version") == [("0009",)]
