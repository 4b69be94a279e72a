"""What chat search costs on SQLite (FTS5) and PostgreSQL (tsvector) for the same stored messages: the time
migrations 0006 and 0008 (the owner-keyed index) take to index them, what the index adds on disk, and search
latencies for a rare word, a word in one message of eight and a word in every message.

    .venv/bin/python -m bench.tools.search_cost --messages 50000

PostgreSQL is a throwaway server (tests/postgres.py: Debian's binaries, a temp dir, 127.0.0.1 only), stopped after.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

from alembic import command
from sqlalchemy import text

from app.db import Store
from app.db.database import alembic_config, create_db_engine
from app.db.quota import database_bytes
from tests.postgres import start_postgres  # run from a checkout: the tests' throwaway PostgreSQL

NUM_OWNERS = 20
SEARCHES = {"rare": "zanzibar", "one in eight": "lighthouse", "every message": "common"}


def make_messages(num_messages: int, seed: int = 0) -> list[tuple[str, str, int, str]]:
    """(session id, owner, position, text): 20-120 words of a 5,000-word vocabulary, the searched words planted."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(5000)
    ]
    rare = set(rng.sample(range(num_messages), 67))
    rows = []
    for i in range(num_messages):
        words = rng.choices(vocabulary, k=rng.randint(20, 120)) + ["common"]
        if i in rare:
            words.append("zanzibar")
        if i % 8 == 0:
            words.append("lighthouse")
        rng.shuffle(words)
        rows.append((f"s{i // 10}", f"owner{(i // 10) % NUM_OWNERS}", i % 10, " ".join(words)))
    return rows


def fill_at_0005(url: str, rows: list[tuple[str, str, int, str]]) -> None:
    command.upgrade(alembic_config(url), "0005")
    engine = create_db_engine(url)
    now = "2026-01-01 00:00:00"
    with engine.begin() as conn:
        sessions = sorted({(sid, owner) for sid, owner, _, _ in rows})
        conn.execute(
            text("INSERT INTO chat_sessions VALUES (:sid, :owner, 't', '', '{}', :now, :now, NULL, NULL)"),
            [{"sid": sid, "owner": owner, "now": now} for sid, owner in sessions],
        )
        conn.execute(
            text(
                "INSERT INTO messages (session_id, position, role, content, status, created_at, updated_at) "
                "VALUES (:sid, :position, 'user', :content, 'complete', :now, :now)"
            ),
            [{"sid": sid, "position": p, "content": c, "now": now} for sid, _, p, c in rows],
        )
    engine.dispose()


def size_of(url: str) -> int:
    from sqlalchemy.orm import Session

    engine = create_db_engine(url)
    with Session(engine) as s:
        size = database_bytes(s)
    engine.dispose()
    assert size is not None
    return size


async def search_times(url: str, repeats: int) -> dict[str, list[float]]:
    store = Store(url)
    await store.start()
    times: dict[str, list[float]] = {}
    try:
        for name, word in SEARCHES.items():
            for owner in range(repeats):
                began = time.perf_counter()
                await store.chats.search_messages(f"owner{owner % NUM_OWNERS}", word)
                times.setdefault(name, []).append((time.perf_counter() - began) * 1000)
    finally:
        await store.close()
    return times


def measure(label: str, url: str, rows: list[tuple[str, str, int, str]], repeats: int) -> None:
    fill_at_0005(url, rows)
    before = size_of(url)
    began = time.perf_counter()
    command.upgrade(alembic_config(url), "head")
    took = time.perf_counter() - began
    after = size_of(url)
    print(
        f"{label}: indexed {len(rows)} messages in {took:.1f} s; {before / 2**20:.0f} MB -> {after / 2**20:.0f} MB"
    )
    for name, ms in asyncio.run(search_times(url, repeats)).items():
        print(f"  {name:14s} median {statistics.median(ms):7.1f} ms   max {max(ms):7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=20, help="searches per word (over the owners)")
    args = parser.parse_args()
    rows = make_messages(args.messages)
    print(f"{len(rows)} messages, {sum(len(r[3]) for r in rows) / 2**20:.0f} MB of text, {NUM_OWNERS} owners")
    with tempfile.TemporaryDirectory() as tmp:
        measure("SQLite", f"sqlite:///{tmp}/search.db", rows, args.repeats)
    server = start_postgres()
    try:
        measure(f"PostgreSQL {server.version}", server.url(server.create_database()), rows, args.repeats)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
