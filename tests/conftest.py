"""Suite-wide setup: Triton's interpreter must be chosen before triton is first imported (CPU machines only); the
cores and the suite split across pytest-xdist workers (`make test` runs two)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests import tokenizer_memo

pytest_plugins = ["tests.budget"]  # a time budget per test, and the slowest tests in the summary

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _threads_per_worker() -> int | None:
    """Each xdist worker's share of the cores (None outside xdist). Two workers that each ran torch and the native
    kernels on every core ran two OpenMP pools of spinning threads on 2 cores: the real-model tests took 2-5x as
    long as alone (a 10-turn server conversation 141 s instead of ~20)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None


if (_THREADS := _threads_per_worker()) is not None:
    torch.set_num_threads(_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)  # the servers and scripts the tests start inherit it

tokenizer_memo.install()  # each model's tokenizer loaded once per worker for the engines the tests build


# the folders whose modules take longest (real servers, the real model) run first, so that the two workers end
# together rather than one waiting on a long module picked up last
FIRST_FOLDERS = ("tests/e2e/", "tests/reliability/", "tests/engine/", "tests/bench/")


def _folder_rank(item: pytest.Item) -> int:
    return next((i for i, f in enumerate(FIRST_FOLDERS) if item.nodeid.startswith(f)), len(FIRST_FOLDERS))


def pytest_collection_modifyitems(config, items):
    """The slow folders first (a stable sort: a module's tests stay together and in order). `make test` runs
    `--dist loadfile --no-loadscope-reorder`: a module is one unit of work, in this order, so its module-scoped
    servers and models are built once, on one worker. (Not loadgroup: pytest-xdist 3.8 renames node ids for it in a
    way pytest 9 ignores, so its groups silently fall apart.)"""
    items.sort(key=_folder_rank)


@pytest.fixture(autouse=True, scope="session")
def _private_kv_disk_tiers(tmp_path_factory):
    """Every engine the tests build without a tier directory of its own gets a fresh, empty one (never
    ~/.cache/pagedchat/kv): blocks another test (or an earlier run) wrote must not turn a miss into a hit. Session
    scoped, so engines built by module-scoped fixtures are covered too."""
    import tempfile

    import engine.tiers.setup

    root = tmp_path_factory.mktemp("kv-tiers")

    def fresh_dir(config) -> Path:
        return Path(config.kv_disk_dir) if config.kv_disk_dir else Path(tempfile.mkdtemp(dir=root))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine.tiers.setup, "tier_dir", fresh_dir)
        yield


@pytest.fixture(autouse=True)
def _no_block_stays_in_use():
    """After every test, each app that make_client (tests/app/factories.py) has open, module-scoped ones included,
    must hold no block: a leak fails the test that caused it, as a teardown error naming what stayed in use. Suite
    wide because tests/reliability makes such apps too; the tests that never imported make_client pay nothing."""
    yield
    if (live_clients := sys.modules.get("tests.app.live_clients")) is not None:
        live_clients.check_live_clients()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the whole session (tests/postgres.py), stopped at its end; the tests that use it
    skip, saying why, where none can be started here (no server binaries, no psycopg)."""
    from tests.postgres import PostgresUnavailable, start_postgres

    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server for the tests: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_template(postgres) -> str:
    """A database migrated to head once, which each test's database copies (CREATE DATABASE ... TEMPLATE)."""
    from app.db.database import create_db_engine, upgrade_to_head

    name = postgres.create_database()
    engine = create_db_engine(postgres.url(name))
    try:
        upgrade_to_head(engine)
    finally:
        engine.dispose()  # a template must have no connections while it is copied
    return name
