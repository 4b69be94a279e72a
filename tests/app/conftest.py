"""Fixtures of the history tests (SmolLM2's tokenizer where provisioned, and a tiny ChatML one), and the databases
of the store and migration tests: `db_backend` runs a test on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.conversation_factories import SMOLLM2_PATH, make_chatml_tokenizer
from tests.app.databases import TestDatabase, make_test_database

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="module")
def smollm2() -> Any:
    if not (SMOLLM2_PATH / "tokenizer.json").is_file():
        pytest.skip(f"SmolLM2 not provisioned at {SMOLLM2_PATH} (scripts/setup_test_deps.sh)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOLLM2_PATH))


@pytest.fixture(params=["smollm2", "chatml"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    if request.param == "smollm2":
        return request.getfixturevalue("smollm2")
    return make_chatml_tokenizer()


@pytest.fixture(params=BACKENDS)
def db_backend(request: pytest.FixtureRequest) -> str:
    """The database a store or migration test runs on: a SQLite file, or a database of the session's PostgreSQL
    server (the test skips, saying why, where no server can run)."""
    return request.param


@pytest.fixture
def make_db(
    db_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., TestDatabase]]:
    """Make fresh databases of this test's backend: `make_db()` at head (PostgreSQL: a copy of the migrated
    template, so the store's start finds nothing to do), `make_db(empty=True)` with no schema at all. PostgreSQL
    databases are dropped afterwards."""
    made: list[TestDatabase] = []
    server = request.getfixturevalue("postgres") if db_backend == "postgresql" else None

    def make(*, empty: bool = False) -> TestDatabase:
        template = None if empty or server is None else request.getfixturevalue("postgres_template")
        database = make_test_database(db_backend, tmp_path / f"chat{len(made) or ''}.db", server, template)
        made.append(database)
        return database

    yield make
    for database in made:
        database.drop()


@pytest.fixture
def db(make_db: Callable[..., TestDatabase]) -> TestDatabase:
    """A fresh database at head on this test's backend."""
    return make_db()


@pytest.fixture
def empty_db(make_db: Callable[..., TestDatabase]) -> TestDatabase:
    """A fresh database without any schema on this test's backend (for the migration tests)."""
    return make_db(empty=True)
