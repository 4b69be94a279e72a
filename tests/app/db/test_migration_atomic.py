"""A migration that fails halfway on SQLite leaves nothing behind: pysqlite's legacy transaction handling ran DDL
outside the migration's transaction, so a CREATE TABLE stayed while alembic_version named the old revision."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

import app.db.database as database
from app.db.database import create_db_engine, upgrade_to_head

FAILING_MIGRATION = '''"""A migration that creates a table, writes a row, then fails."""

import sqlalchemy as sa
from alembic import op

revision = "9999"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("half_done", sa.Column("id", sa.Integer(), primary_key=True))
    op.add_column("presets", sa.Column("half_done_flag", sa.Integer(), nullable=True))
    op.execute("INSERT INTO half_done (id) VALUES (1)")
    raise RuntimeError("migration 9999 fails halfway")


def downgrade() -> None:
    pass
'''


def migrations_with_a_failing_one(tmp_path: Path, head: str) -> Path:
    """A copy of the migrations with 9999 after `head`."""
    folder = tmp_path / "migrations"
    shutil.copytree(database.migrations_dir(), folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "versions" / "9999_fails.py").write_text(FAILING_MIGRATION.format(head=head))
    return folder


@pytest.mark.parametrize("in_memory", [False, True])
def test_a_sqlite_migration_failing_after_create_table_leaves_no_table_and_the_old_revision(
    tmp_path, monkeypatch, in_memory
):
    engine = create_db_engine("sqlite://" if in_memory else f"sqlite:///{tmp_path}/chat.db")
    upgrade_to_head(engine)
    with engine.connect() as conn:
        head = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    tables = sorted(inspect(engine).get_table_names())
    presets = [c["name"] for c in inspect(engine).get_columns("presets")]
    folder = migrations_with_a_failing_one(tmp_path, head)
    monkeypatch.setattr(database, "migrations_dir", lambda: folder)

    with pytest.raises(RuntimeError, match="fails halfway"):
        upgrade_to_head(engine)

    inspector = inspect(engine)
    assert sorted(inspector.get_table_names()) == tables  # no half_done
    assert [c["name"] for c in inspector.get_columns("presets")] == presets
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [(head,)]
        # the runtime engine is as before: WAL on a file, foreign keys on, pysqlite's usual transactions
        assert conn.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
        if not in_memory:
            assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert conn.connection.dbapi_connection.isolation_level == ""
    engine.dispose()


def test_alembic_says_the_sqlite_upgrade_is_transactional(tmp_path, caplog):
    """Its log line matches what upgrade_to_head does (Alembic's SQLite default would say "non-transactional")."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'chat.db'}")
    try:
        with caplog.at_level("INFO", logger="alembic.runtime.migration"):
            upgrade_to_head(engine)
    finally:
        engine.dispose()
    said = [r.getMessage() for r in caplog.records if "transactional DDL" in r.getMessage()]
    assert said and all(m == "Will assume transactional DDL." for m in said), said
