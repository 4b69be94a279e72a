"""Where the KV disk tier lives, with real `pagedchat serve` processes (tiny model):

- a directory made beforehand is left as it is (mode and files): the tier works in its own subdirectory, 0700, its
  files 0600;
- one tier per directory: a second server on the same directory serves without one and says so once;
- a directory that cannot be used (not a directory, read-only) or a cap below one block (a nearly full disk):
  the server starts, serves, warns once, and its stats show no tier;
- the directory going away under a running server: its next write fails, the tier turns itself off (one warning,
  `enabled` false in the stats) and serving goes on.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.common.servers import stop_server
from engine.tiers.tier_dir import MARKER, SUBDIR
from tests.e2e.conftest import Server, server_env, start_server

HELLO = "Tell me something about lighthouses and their keepers, please."


def chat(server: Server, content: str = HELLO) -> openai.types.chat.ChatCompletion:
    """One greedy chat turn through the official client; it must finish normally."""
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": content}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
    return reply


def tier_warnings(server: Server) -> list[str]:
    return [line for line in server.log().splitlines() if " WARNING " in line and "KV disk tier" in line]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def kv_dir(tmp_path_factory) -> Path:
    """A tier directory made beforehand with mode 0755, as an operator might."""
    directory = tmp_path_factory.mktemp("shared-tier") / "kv"
    directory.mkdir()
    directory.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def owner(tmp_path_factory, tiny_model, shared_cache_dir, kv_dir) -> Iterator[Server]:
    """The first server on `kv_dir`, after one chat turn whose blocks are on disk."""
    home = tmp_path_factory.mktemp("owner")
    env = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir), "PAGEDCHAT_KV_DISK_DIR": str(kv_dir)}
    running = start_server(home, server_env(home, tiny_model, **env))
    try:
        chat(running)
        tier = running.wait_tier_written()
        assert tier["enabled"] and tier["num_writes"] > 0, tier
        yield running
    finally:
        stop_server(running)


def test_tier_directory_is_0700_and_its_files_0600(owner, kv_dir):
    own = kv_dir / SUBDIR
    files = sorted(own.iterdir())
    assert len([f for f in files if f.suffix == ".kvb"]) == owner.admin_state()["stats"]["tier"]["num_files"]
    assert mode(kv_dir) == 0o755 and [p.name for p in kv_dir.iterdir()] == [SUBDIR]  # not the tier's: left so
    assert mode(own) == 0o700
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}  # blocks, lock and marker
    assert (own / MARKER).is_file()


def test_a_second_server_on_the_same_directory_serves_without_the_tier(
    owner, kv_dir, server_factory, shared_cache_dir
):
    num_files = len(list((kv_dir / SUBDIR).iterdir()))
    env = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir), "PAGEDCHAT_KV_DISK_DIR": str(kv_dir)}
    second = server_factory(home="second", **env)
    chat(second)
    assert second.admin_state()["stats"]["tier"] is None
    [warning] = tier_warnings(second)
    assert f"BlockingIOError: another process uses the KV disk tier at {kv_dir / SUBDIR}" in warning
    assert len(list((kv_dir / SUBDIR).iterdir())) == num_files  # it wrote nothing there
    assert owner.admin_state()["stats"]["tier"]["enabled"] is True  # the owner keeps its tier
    assert not tier_warnings(owner)


def test_the_tier_turns_off_when_its_directory_goes_away_under_a_running_server(owner, kv_dir):
    before = owner.admin_state()["stats"]["tier"]
    shutil.rmtree(kv_dir)
    kv_dir.write_bytes(b"")  # a file where the directory was: every write in it fails (ENOTDIR)
    chat(owner, "Another question entirely: how tall was the tallest lighthouse ever built?")
    tier = owner.wait_tier_written()  # its new blocks were offered at the turn's end; the first write failed
    assert (tier["enabled"], tier["num_write_errors"], tier["num_writes"]) == (False, 1, before["num_writes"])
    [warning] = tier_warnings(owner)
    assert "KV disk tier turned off (serving goes on without it): writing" in warning
    chat(owner, "And the oldest one still standing?")  # serving goes on; nothing more is tried
    assert len(tier_warnings(owner)) == 1


def unusable_dir(tmp_path: Path, case: str) -> Path:
    """A tier directory the server cannot use."""
    if case == "not_a_directory":
        (tmp_path / "a-file").write_bytes(b"")
        return tmp_path / "a-file" / "kv"  # mkdir: NotADirectoryError, for root too
    parent = tmp_path / "read-only"
    parent.mkdir(mode=0o500)
    if os.access(parent, os.W_OK):
        pytest.skip("running as root: a 0500 directory is still writable")
    return parent / "kv"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("not_a_directory", "KV disk tier off (serving goes on without it): NotADirectoryError"),
        ("read_only", "KV disk tier off (serving goes on without it): PermissionError"),
        ("cap_below_one_block", "KV disk tier off: its cap of 1000 bytes holds no block of 8192 bytes"),
    ],
)
def test_an_unusable_tier_leaves_the_server_serving_without_it(
    case, expected, server_factory, shared_cache_dir, tmp_path
):
    env = {"PAGEDCHAT_CACHE_DIR": str(shared_cache_dir)}
    if case == "cap_below_one_block":
        kv_dir = tmp_path / "kv"
        env["PAGEDCHAT_KV_DISK_BYTES"] = "1000"
    else:
        kv_dir = unusable_dir(tmp_path, case)
    server = server_factory(home="server", PAGEDCHAT_KV_DISK_DIR=str(kv_dir), **env)
    assert httpx.get(server.base_url + "/health").json()["status"] == "ok"
    chat(server)
    chat(server)
    [warning] = tier_warnings(server)
    assert expected in warning, warning
    stats = server.admin_state()["stats"]
    assert stats["tier"] is None and stats["disk_hit_tokens"] == 0
    assert not kv_dir.exists()
