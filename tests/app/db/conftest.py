"""The store every database test module uses: migrated on the test's database (SQLite, or PostgreSQL too)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.db import Store
from tests.app.databases import TestDatabase


@pytest.fixture
async def store(db: TestDatabase) -> AsyncIterator[Store]:
    s = Store(db.url)
    await s.start()
    yield s
    await s.close()
