"""What a server keeps on disk, attacked as another user of the machine would (issue #35, items 9-11), with two real
starts of `pagedchat serve` on one database (tiny model):

1. `--kv-disk-dir` is a shared directory (mode 1777, as /tmp is) holding another user's `x.tmp` and a file of
   theirs: the start leaves its mode and their files alone, and the tier works in a 0700 subdirectory of its own;
   the database, its -wal and -shm, and the tier's MAC key (beside the database) are 0600.
2. Between the starts, someone with write access to the tier rewrites every block (another KV, the checksum slot
   recomputed as an unkeyed xxh3 over header and payload) and opens the database up to 0644: the second start
   warns about the database's mode, and the same chat turn is computed again, never served from the rewritten
   blocks, with the same reply.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import xxhash

from bench.common.servers import stop_server
from engine.tiers.block_file import HEADER_BYTES, MAC_BYTES  # the MAC's slot: format 1's checksum's
from engine.tiers.tier_dir import SUBDIR
from tests.e2e.conftest import Server, server_env, start_server

NOBODY = 65534
FOREIGN = {"x.tmp": b"another user's temporary", "report.txt": b"another user's file"}
PROMPT = "Tell me about the lighthouse on the northern cape and the keepers who kept its lamp lit. " * 3


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def ask(server: Server) -> str:
    """One greedy chat turn (its prompt fills several KV blocks); the reply's text."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].finish_reason == "length"
    return reply.choices[0].message.content


def forge(path: Path) -> None:
    """Rewrite a block without the key: all-zero KV, the checksum slot recomputed as format 1 did."""
    data = path.read_bytes()
    fields, payload = data[: HEADER_BYTES - MAC_BYTES], bytes(len(data) - HEADER_BYTES)
    path.write_bytes(fields + xxhash.xxh3_128(fields + payload).digest() + payload)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The servers' directory: their database (chat.db), log and cache dir."""
    return tmp_path_factory.mktemp("storage")


@pytest.fixture(scope="module")
def shared(home) -> Path:
    """A directory like /tmp: 1777, with files of another user in it (theirs when the tests run as root)."""
    directory = home / "shared"
    directory.mkdir()
    directory.chmod(0o1777)
    for name, content in FOREIGN.items():
        (directory / name).write_bytes(content)
        if os.geteuid() == 0:
            os.chown(directory / name, NOBODY, NOBODY)
    return directory


@pytest.fixture(scope="module")
def env(home, shared, tiny_model) -> dict[str, str]:
    return server_env(home, tiny_model, PAGEDCHAT_KV_DISK_DIR=str(shared))


@pytest.fixture(scope="module")
def first(home, env) -> Iterator[tuple[Server, str]]:
    """The first start, after one chat turn whose blocks are written to the tier; (server, its reply)."""
    server = start_server(home, env)
    try:
        reply = ask(server)
        tier = server.wait_tier_written()
        assert tier["enabled"] and tier["num_writes"] > 0, tier
        yield server, reply
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def second(first, home, env, shared) -> Iterator[tuple[Server, str]]:
    """The first server stopped, its blocks rewritten and its database opened up, then a second start and the same
    chat turn; (server, its reply)."""
    server, _ = first
    stop_server(server)
    blocks = sorted(shared.rglob("*.kvb"))
    assert blocks
    for path in blocks:
        forge(path)
    (home / "chat.db").chmod(0o644)
    again = start_server(home, env)
    try:
        yield again, ask(again)
    finally:
        stop_server(again)


def test_a_shared_kv_dir_keeps_its_mode_and_others_files(first, shared):
    server, _ = first
    assert mode(shared) == 0o1777
    assert {name: (shared / name).read_bytes() for name in FOREIGN} == FOREIGN
    assert sorted(p.name for p in shared.iterdir()) == sorted([*FOREIGN, SUBDIR])
    own = shared / SUBDIR
    assert mode(own) == 0o700 and own.stat().st_uid == os.geteuid()
    assert server.admin_state()["stats"]["tier"]["num_files"] == len(list(own.glob("*.kvb"))) > 0
    assert f"KV disk tier: {shared} was not made by the tier" in server.log()


def test_the_database_and_the_tier_key_are_0600(first, home):
    files = [
        home / name for name in ("chat.db", "chat.db-wal", "chat.db-shm")
    ]  # the server runs: all three there
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    assert mode(home / "kv-tier.key") == 0o600


def test_a_rewritten_block_is_never_served(first, second):
    _, expected = first
    server, reply = second
    stats = server.admin_state()["stats"]
    assert stats["disk_hit_tokens"] == 0 and stats["tier"]["num_loaded_blocks"] == 0
    assert (
        stats["tier"]["num_load_failures"] >= 1
    )  # each block read (several at once) failed its MAC: recomputed
    assert "MAC mismatch" in server.log()
    assert reply == expected


def test_a_database_opened_up_is_warned_about_at_start(second, home):
    server, _ = second
    assert f"database file {home / 'chat.db'} has mode 644" in server.log()
