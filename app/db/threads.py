"""Where the database work runs: one writer thread and a few reader threads, off the event loop, and the one helper
every feature's store calls through (`reads` / `writes`: a synchronous function of an ORM session, bound as an
async method that runs it on a reader or on the writer). No query is written twice.

One writer: SQLite has one anyway, and writes land in the order they were awaited. Readers apart: a write waiting
for a lock (another process holds it, up to `busy_timeout_ms`) holds up the writer thread, but never /health or a
listing, since SQLite in WAL mode (and PostgreSQL) reads the last committed state while another connection writes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.db.database import DEFAULT_BUSY_TIMEOUT_MS, check_schema_known, create_db_engine, upgrade_to_head
from app.db.quota import QUOTA_KEY, StorageQuota, database_bytes
from app.db.records import StoreUnavailable
from app.db.usage import UsageLedger

logger = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")
NUM_READERS = 4
NOT_RUNNING = "the database is not running: await start() first (and not after close())"


class Database:
    """The connection pool and the threads of a database, and its storage quota. `read` and `write` run a
    function of an ORM session in one transaction; writes are committed before they return, and what they change
    of an owner's usage joins the running figures then. Database failures raise StoreUnavailable; calls before
    `start()` or after `close()` raise RuntimeError. `start()` migrates to head, then runs `on_start` (each a
    function of a session) in one transaction on the writer."""

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        quota: StorageQuota | None = None,
        on_start: Sequence[Callable[[Session], object]] = (),
    ) -> None:
        self.url = url
        self.quota = quota or StorageQuota()
        owner_limits = (self.quota.max_sessions, self.quota.max_messages, self.quota.max_bytes)
        self._usage = UsageLedger() if any(owner_limits) else None  # writer thread only
        self._on_start = tuple(on_start)
        self._busy_timeout_ms = busy_timeout_ms
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None
        self._executor: ThreadPoolExecutor | None = None  # the writer
        self._readers: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Migrate to head, then run `on_start` in one transaction on the writer."""
        if self._executor is not None:
            raise RuntimeError("Database.start() called twice")
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

    async def check_schema(self) -> None:
        """Before anything slow starts (the model): refuse a schema revision this code does not know (ValueError),
        and a database that cannot be opened (StoreUnavailable, as `start()` would)."""
        await asyncio.to_thread(self._check_schema)

    def _check_schema(self) -> None:
        engine = create_db_engine(self.url, busy_timeout_ms=self._busy_timeout_ms)
        try:
            with engine.connect() as connection:
                check_schema_known(connection)
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(f"database unavailable ({self._safe_url()}): {cause}") from exc
        finally:
            engine.dispose()

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

    async def database_bytes(self) -> int | None:
        """Bytes the database uses as `max_database_bytes` counts them (SQLite: pages in use; PostgreSQL: the
        tables' size; None elsewhere)."""
        return await self.read(database_bytes)

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(session, *args, **kwargs)` in one transaction on the writer thread, committed before returning."""
        return await self._call(functools.partial(self._transaction, True, fn, *args, **kwargs))

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(session, *args, **kwargs)` on a reader thread; `fn` must not write."""
        return await self._call(functools.partial(self._transaction, False, fn, *args, **kwargs), reader=True)

    async def _call(self, fn: Callable[[], T], reader: bool = False) -> T:
        executor = self._readers if reader else self._executor
        if executor is None:
            raise RuntimeError(NOT_RUNNING)
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn)
        except sa_exc.IntegrityError:
            raise  # a constraint the store checks first: a bug, not an outage
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            cause = getattr(exc, "orig", None) or exc
            raise StoreUnavailable(f"database unavailable ({self._safe_url()}): {cause}") from exc

    def _transaction(self, write: bool, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(session, ...)` in one transaction carrying the quota; a write's usage notes join the running
        figures once it has committed."""
        if self._sessions is None:
            raise RuntimeError(NOT_RUNNING)
        usage = self._usage if write else None
        with self._sessions.begin() as s:
            s.info[QUOTA_KEY] = self.quota
            if usage is not None:
                usage.begin(s)
            result = fn(s, *args, **kwargs)
        if usage is not None:
            usage.commit(s)  # committed: what the writes noted joins the running figures
        return result

    def _open(self) -> None:
        engine = create_db_engine(self.url, busy_timeout_ms=self._busy_timeout_ms)
        try:
            upgrade_to_head(engine)
            sessions = sessionmaker(engine, expire_on_commit=False)
            with sessions.begin() as s:
                for prepare in self._on_start:
                    prepare(s)
        except BaseException:
            engine.dispose()
            raise
        self._engine, self._sessions = engine, sessions

    def _ping(self) -> None:
        if self._engine is None:
            raise RuntimeError(NOT_RUNNING)
        with self._engine.connect() as conn:
            conn.execute(text("SELECT version_num FROM alembic_version")).all()

    def _safe_url(self) -> str:
        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except sa_exc.ArgumentError:
            return "<invalid url>"


class FeatureStore:
    """One feature's store over the shared database: its methods are its module's synchronous functions, bound
    with `reads` and `writes`."""

    def __init__(self, db: Database) -> None:
        self.db = db


class Bound(Generic[P, T]):
    """A synchronous function of a session, as an async method of a `FeatureStore` run on the database's threads."""

    def __init__(self, fn: Callable[Concatenate[Session, P], T], *, write: bool) -> None:
        self.fn = fn
        self.write = write
        functools.update_wrapper(self, fn)

    def __get__(self, store: FeatureStore | None, owner: type | None = None) -> Callable[P, Awaitable[T]]:
        if store is None:
            return self  # type: ignore[return-value]  # the class attribute itself
        run = store.db.write if self.write else store.db.read
        fn = self.fn

        @functools.wraps(fn)
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await run(fn, *args, **kwargs)

        return call


def reads(fn: Callable[Concatenate[Session, P], T]) -> Bound[P, T]:
    """`fn(session, ...)` as an async method that runs it on a reader thread (it must not write)."""
    return Bound(fn, write=False)


def writes(fn: Callable[Concatenate[Session, P], T]) -> Bound[P, T]:
    """`fn(session, ...)` as an async method that runs it in one transaction on the writer thread."""
    return Bound(fn, write=True)
