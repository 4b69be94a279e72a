"""A test's database on either backend: its URL, and plain SQL on it from outside the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.pool import NullPool

from tests.postgres import PostgresServer


@dataclass
class TestDatabase:
    """One fresh database: SQLite (`path`) or a database of the session's PostgreSQL server (`name`)."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    backend: str
    url: str
    path: Path | None = None
    server: PostgresServer | None = None
    name: str | None = None
    _engine: Engine | None = field(default=None, repr=False)

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    @property
    def page_size(self) -> int:
        """The database's page (SQLite) or block (PostgreSQL) size in bytes."""
        return 4096 if self.is_sqlite else 8192

    def engine(self) -> Engine:
        """An engine on the database for the test's own SQL: no pool (nothing stays open), no pragmas."""
        if self._engine is None:
            self._engine = create_engine(self.url, poolclass=NullPool)
        return self._engine

    def raw(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        """Run `sql` (named parameters, `:name`) in a transaction of its own, outside the store; the rows."""
        with self.engine().begin() as conn:
            result = conn.execute(text(sql), params or {})
            return [tuple(row) for row in result] if result.returns_rows else []

    def tables(self) -> set[str]:
        """The names of the database's tables."""
        return set(inspect(self.engine()).get_table_names())

    def columns(self, table: str) -> list[str]:
        """The names of a table's columns, in order."""
        return [c["name"] for c in inspect(self.engine()).get_columns(table)]

    def drop(self) -> None:
        """Close the test's connections; PostgreSQL: drop the database."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self.server is not None and self.name is not None:
            self.server.drop_database(self.name)


def make_test_database(
    backend: str, path: Path, server: PostgresServer | None, template: str | None
) -> TestDatabase:
    """A fresh database: a SQLite file at `path` (not created yet), or a new PostgreSQL database (a copy of
    `template` when given)."""
    if backend == "sqlite":
        return TestDatabase(backend, f"sqlite:///{path}", path=path)
    assert backend == "postgresql" and server is not None, (backend, server)
    name = server.create_database(template)
    return TestDatabase(backend, server.url(name), server=server, name=name)
