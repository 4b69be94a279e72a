"""Opening a database: a SQLAlchemy engine (SQLite with its pragmas, or PostgreSQL through psycopg 3), and migrating
it to head with Alembic."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from app.db.search import is_search_index_column, is_search_index_table

logger = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_MS = 5000
# PostgreSQL: the store holds one writer and four reader threads (app/db/threads.py), each on a connection of its
# own; a few more for `pagedchat users` and the health check's ping. Connections idle for long are replaced
# (a proxy or the server may have dropped them; pre-ping catches the rest).
PG_POOL_SIZE = 5
PG_MAX_OVERFLOW = 5
PG_POOL_RECYCLE_S = 1800
PG_CONNECT_TIMEOUT_S = 10
# one number that every pagedchat process migrating the same PostgreSQL database locks on (a transaction-scoped
# advisory lock): processes started together migrate one after the other, the later ones find the schema at head
PG_MIGRATION_LOCK = 0x70616765  # "page"
PG_MIGRATION_WAIT_S = 600


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
    migration 0006 makes by hand (SQLite: an FTS5 table and its shadow tables; PostgreSQL: a tsvector column of
    messages and its GIN index)."""
    if name is None:
        return True
    if type_ == "table":
        return not is_search_index_table(name)
    if type_ in ("column", "index"):
        return not is_search_index_column(name)
    return True


def create_db_engine(url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """An engine for `url`. SQLite connections get WAL, synchronous=NORMAL, foreign keys and a busy timeout;
    PostgreSQL ones (`postgresql+psycopg://`; plain `postgresql://` means the same) a pool sized for the store's threads, a connect timeout, and
    `busy_timeout_ms` as their lock_timeout (a write that waits longer for a lock fails: the store is unavailable)."""
    if busy_timeout_ms < 0:
        raise ValueError(f"busy_timeout_ms must be non-negative, got {busy_timeout_ms}")
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.drivername == "postgresql":  # no driver named: psycopg 3, not SQLAlchemy's default psycopg2
            url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        return _create_postgresql_engine(url, busy_timeout_ms)
    is_sqlite = backend == "sqlite"
    if is_sqlite:
        keep_private(parsed.database, parsed.query)
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


def keep_private(database: str | None, query: Any = None) -> None:
    """A SQLite database file holds every chat and password hash: made 0600 before SQLite opens it (SQLite gives its
    -wal and -shm files the database's mode), and a looser mode on an existing one is warned about, not changed
    (an operator may have chosen it)."""
    if not database or database == ":memory:" or (query and "uri" in query):
        return
    path = Path(database).expanduser()
    try:  # SQLite takes an empty file for a new database
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    except OSError:  # a missing folder, a read-only one: SQLite says what is wrong when it opens the file
        return
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
        except OSError:
            continue
        if mode & 0o077:
            logger.warning(
                "database file %s has mode %o: other users of this machine can read every chat and password hash "
                "in it (chmod 600 it, and its -wal and -shm files)",
                file, mode,
            )  # fmt: skip


def _create_postgresql_engine(url: str, busy_timeout_ms: int) -> Engine:
    # lock_timeout 0 would mean "wait forever", while a busy timeout of 0 means "do not wait": 1 ms is the nearest
    options = f"-c lock_timeout={max(int(busy_timeout_ms), 1)} -c TimeZone=UTC"
    try:
        return create_engine(
            url,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S, "options": options},
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_MAX_OVERFLOW,
            pool_recycle=PG_POOL_RECYCLE_S,
            pool_pre_ping=True,
        )
    except ModuleNotFoundError as exc:
        shown = make_url(url).render_as_string(hide_password=True)
        raise RuntimeError(
            f"the database URL {shown} needs the Python driver {exc.name!r}, which is not installed: PostgreSQL "
            "works through psycopg 3 (pip install -e '.[postgres]', URLs postgresql+psycopg://...)"
        ) from exc


def upgrade_to_head(engine: Engine) -> None:
    """Create or upgrade the schema to the newest migration, in one transaction (SQLite and PostgreSQL both allow
    it: a migration that fails leaves the schema and alembic_version as they were)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    is_sqlite = engine.dialect.name == "sqlite"
    migrating = _with_transactional_ddl(engine) if is_sqlite else engine
    with migrating.connect() as connection:
        dbapi_connection = connection.connection.dbapi_connection
        legacy_isolation = dbapi_connection.isolation_level if is_sqlite else None
        if is_sqlite:
            # pysqlite's legacy transaction handling begins a transaction only before INSERT/UPDATE/DELETE, so
            # CREATE TABLE, ALTER, DROP ran outside it and stayed when a migration failed later: the driver's own
            # BEGIN off here, the `begin` event emits one (SQLAlchemy's pysqlite recipe for transactional DDL)
            dbapi_connection.isolation_level = None
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":  # another process may be migrating: wait for it
                    connection.execute(text(f"SET LOCAL lock_timeout = '{PG_MIGRATION_WAIT_S}s'"))
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK})
                    connection.execute(
                        text("SET LOCAL lock_timeout TO DEFAULT")
                    )  # the migration's own locks: as usual
                check_schema_known(connection)
                cfg.attributes["connection"] = connection  # env.py migrates on this connection (pragmas set)
                # and its DDL is transactional here, on SQLite too (above): Alembic's SQLite default says it is not
                cfg.attributes["transactional_ddl"] = True
                command.upgrade(cfg, "head")
        finally:
            if is_sqlite:  # the pooled connection goes back to the app's runtime behaviour
                dbapi_connection.isolation_level = legacy_isolation
    logger.info("database schema at head (%s)", engine.url.render_as_string(hide_password=True))


def check_schema_known(connection: Connection) -> None:
    """Raise ValueError when the database's schema revision is not one of this checkout's migrations: a newer
    pagedchat migrated it (Alembic would fail with "Can't locate revision", and a traceback)."""
    script = ScriptDirectory.from_config(
        alembic_config(connection.engine.url.render_as_string(hide_password=False))
    )
    known = {rev.revision for rev in script.walk_revisions()}
    # (only reads the heads; transactional_ddl as upgrade_to_head migrates, so Alembic's log line says what happens)
    context = MigrationContext.configure(connection, opts={"transactional_ddl": True})
    unknown = sorted(set(context.get_current_heads()) - known)
    if unknown:
        raise ValueError(
            f"the database schema is at revision {', '.join(unknown)}, newer than this code (its newest is "
            f"{script.get_current_head()}): a newer pagedchat migrated it; start that version, or restore the "
            "backup taken before the upgrade, or downgrade the schema with the newer checkout "
            "(docs/operators/upgrading.md, Roll back)"
        )


def _with_transactional_ddl(engine: Engine) -> Engine:
    """`engine` sharing its pool (an in-memory database is one connection), whose transactions begin with an
    explicit BEGIN: with the driver's isolation_level None (set by the caller on the connection it migrates, not
    on every new connection as the recipe's `connect` event would, so the runtime engine keeps pysqlite's usual
    handling), DDL runs inside the transaction and rolls back with it. The listener is the copy's own."""
    migrating = engine.execution_options()

    @event.listens_for(migrating, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    return migrating
