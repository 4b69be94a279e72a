"""Opening a database: a SQLAlchemy engine with SQLite pragmas, and migrating it to head with Alembic."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event

from app.db.search import is_search_index_table

logger = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_MS = 5000


def migrations_dir() -> Path:
    """The repository's `migrations/` folder (the supported install is the editable repo)."""
    path = Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").is_file():
        raise RuntimeError(
            f"Alembic migrations not found at {path}: pagedchat must run from its repository (pip install -e .)"
        )
    return path


def alembic_config(url: str) -> Config:
    """An Alembic Config built in code (no alembic.ini): script location and database URL."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolation treats % specially; URLs may hold %-escaped passwords.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def include_in_autogenerate(name: str | None, type_: str, _parent_names: Any) -> bool:
    """Alembic's `include_name`: autogenerate compares the models' tables only, not the search index that
    migration 0006 makes by hand (an FTS5 table and its shadow tables)."""
    return not (type_ == "table" and name is not None and is_search_index_table(name))


def create_db_engine(url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """An engine for `url`; SQLite connections get WAL, synchronous=NORMAL, foreign keys and a busy timeout."""
    if busy_timeout_ms < 0:
        raise ValueError(f"busy_timeout_ms must be non-negative, got {busy_timeout_ms}")
    is_sqlite = url.startswith("sqlite")
    connect_args: dict[str, Any] = {"timeout": busy_timeout_ms / 1000} if is_sqlite else {}
    engine = create_engine(url, connect_args=connect_args, pool_pre_ping=not is_sqlite)
    if is_sqlite:

        @event.listens_for(engine, "connect")
        def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                # busy_timeout first: switching to WAL needs a lock that another process may hold for a moment.
                cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA foreign_keys=ON")
            finally:
                cursor.close()

    return engine


def upgrade_to_head(engine: Engine) -> None:
    """Create or upgrade the schema to the newest migration, in one transaction where the backend allows."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection  # env.py migrates on this connection (pragmas already set)
        command.upgrade(cfg, "head")
    logger.info("database schema at head (%s)", engine.url.render_as_string(hide_password=True))
