"""Where the store's database work runs: one writer thread and a few reader threads, off the event loop.

One writer: SQLite has one anyway, and writes land in the order they were awaited. Readers apart: a write waiting
for a lock (another process holds it, up to `busy_timeout_ms`) holds up the writer thread, but never /health or a
listing, since SQLite in WAL mode (and PostgreSQL) reads the last committed state while another connection writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.db.database import DEFAULT_BUSY_TIMEOUT_MS, create_db_engine, upgrade_to_head
from app.db.records import StoreUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")
NUM_READERS = 4


class StoreThreads:
    """The connection pool and the threads of a store; subclasses add the operations (`_tx` writes, `_read`)."""

    def __init__(self, url: str, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.url = url
        self._busy_timeout_ms = busy_timeout_ms
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._executor: ThreadPoolExecutor | None = None  # the writer
        self._readers: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Migrate to head, then run `_prepare` in one transaction (a subclass's startup work)."""
        if self._executor is not None:
            raise RuntimeError("Store.start() called twice")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedchat-store")
        # an in-memory SQLite database is one per connection: everything then runs on the writer
        url = make_url(self.url)
        in_memory = url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
        self._readers = (
            self._executor
            if in_memory
            else ThreadPoolExecutor(max_workers=NUM_READERS, thread_name_prefix="pagedchat-store-read")
        )
        try:
            await self._call(self._open)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Dispose of the connection pool and stop the threads; safe to call twice."""
        executor, self._executor = self._executor, None
        readers, self._readers = self._readers, None
        if executor is None:
            return
        if readers is not None and readers is not executor:
            readers.shutdown(wait=True)
        engine, self._engine, self._sessions = self._engine, None, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(executor, engine.dispose)
        executor.shutdown(wait=True)

    async def ping(self) -> None:
        """Raise StoreUnavailable when the database cannot be read (never waits behind a write)."""
        await self._call(self._ping, reader=True)

    def _prepare(self, s: Session) -> None:
        """Startup work after the migration, in one transaction on the writer (none here)."""

    async def _tx(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(session, *args)` in one transaction on the writer thread, committed before returning."""
        return await self._call(self._in_transaction, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(session, *args)` on a reader thread; `fn` must not write."""
        return await self._call(self._in_transaction, fn, *args, reader=True)

    async def _call(self, fn: Callable[..., T], *args: Any, reader: bool = False) -> T:
        executor = self._readers if reader else self._executor
        if executor is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except sa_exc.IntegrityError:
            raise  # a constraint the store checks first: a bug, not an outage
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(f"database unavailable ({self._safe_url()}): {cause}") from exc

    def _in_transaction(self, fn: Callable[..., T], *args: Any) -> T:
        if self._sessions is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        with self._sessions.begin() as s:
            return fn(s, *args)

    def _open(self) -> None:
        engine = create_db_engine(self.url, busy_timeout_ms=self._busy_timeout_ms)
        try:
            upgrade_to_head(engine)
            sessions = sessionmaker(engine, expire_on_commit=False)
            with sessions.begin() as s:
                self._prepare(s)
        except BaseException:
            engine.dispose()
            raise
        self._engine, self._sessions = engine, sessions

    def _ping(self) -> None:
        if self._engine is None:
            raise RuntimeError("Store is not running: await store.start() first (and not after close())")
        with self._engine.connect() as conn:
            conn.execute(text("SELECT version_num FROM alembic_version")).all()

    def _safe_url(self) -> str:
        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except sa_exc.ArgumentError:
            return "<invalid url>"
