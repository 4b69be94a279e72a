"""Alembic migrations: empty database to head, models match the migrations, downgrade and upgrade again."""

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

from app.db.database import alembic_config, create_db_engine, migrations_dir, upgrade_to_head
from app.db.models import Base


def make_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'm.db'}"


def test_migrations_folder_is_found_with_a_single_head() -> None:
    path = migrations_dir()
    assert path == Path(__file__).resolve().parents[2] / "migrations"
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert script.get_heads() == ["0001"]
    assert [rev.revision for rev in script.walk_revisions()] == ["0001"]


def test_upgrade_from_empty_to_head_creates_the_schema(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    assert inspect(engine).get_table_names() == []
    upgrade_to_head(engine)
    upgrade_to_head(engine)  # a second start is a no-op
    insp = inspect(engine)
    assert sorted(insp.get_table_names()) == ["alembic_version", "chat_sessions", "messages"]
    assert [c["name"] for c in insp.get_columns("messages")] == [
        c.name for c in Base.metadata.tables["messages"].c
    ]
    assert insp.get_foreign_keys("messages")[0]["options"] == {"ondelete": "CASCADE"}
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == "0001"
    engine.dispose()


def test_models_match_the_migrations(tmp_path: Path) -> None:
    engine = create_db_engine(make_db(tmp_path))
    upgrade_to_head(engine)
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
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
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
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
    assert sorted(inspect(engine).get_table_names()) == ["alembic_version", "chat_sessions", "messages"]
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
            "INSERT INTO chat_sessions VALUES ('s1', 'alice', 't', '', '{}', ?, ?)", (now, now)
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
