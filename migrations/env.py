"""Alembic environment: migrates the connection the app hands over, or opens one from the configured URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.db.database import create_db_engine, include_in_autogenerate
from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=include_in_autogenerate,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
        # the app's upgrade_to_head makes SQLite's DDL transactional too and says so; otherwise the dialect's default
        transactional_ddl=config.attributes.get("transactional_ddl"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL for the configured URL without connecting (`alembic upgrade --sql`)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate the connection in `config.attributes['connection']`, else one opened from `sqlalchemy.url`."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_db_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
