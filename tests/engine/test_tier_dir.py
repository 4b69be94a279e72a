"""Which directory the disk tier owns (engine/tiers/tier_dir.py) and its MAC key (engine/tiers/tier_key.py): a
directory it made, or its own subdirectory of one it did not; others' files, modes, links and directories are left
alone or refused; an older installation's directory is taken over; the key is private and stable."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

import pytest

from engine.core.hash_chain import NO_SALT
from engine.tiers.block_file import BlockName
from engine.tiers.tier_dir import MARKER, SUBDIR, claim_tier_dir, is_block_temporary
from engine.tiers.tier_key import KEY_BYTES, BadTierKey, load_tier_key

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of another user: chown needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def block_file(i: int) -> str:
    return BlockName(bytes(16), NO_SALT, bytes([i]) * 16).filename


def shared_dir(tmp_path: Path) -> Path:
    """A directory like /tmp: mode 1777, holding another user's temporary and file."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    for name in ("x.tmp", "report.txt"):
        (shared / name).write_bytes(b"someone else's")
        if os.geteuid() == 0:
            os.chown(shared / name, NOBODY, NOBODY)
    return shared


def test_a_missing_directory_is_made_private_and_stays_the_tiers(tmp_path, caplog):
    configured = tmp_path / "cache" / "kv"
    with caplog.at_level(logging.INFO, logger="engine.tiers.tier_dir"):
        assert claim_tier_dir(configured) == configured
    assert mode(configured) == 0o700 and mode(configured / MARKER) == 0o600
    assert "made" in caplog.text and "owns it" in caplog.text
    configured.chmod(0o755)  # opened up by hand: the tier made it, so it tightens it again, and says so
    assert claim_tier_dir(configured) == configured and mode(configured) == 0o700
    assert "had mode 755: set back to 0700" in caplog.text


def test_a_shared_directory_is_left_as_it_is_and_the_tier_keeps_to_its_subdirectory(tmp_path, caplog):
    shared = shared_dir(tmp_path)
    with caplog.at_level(logging.INFO, logger="engine.tiers.tier_dir"):
        own = claim_tier_dir(shared)
    assert own == shared / SUBDIR and mode(own) == 0o700 and (own / MARKER).is_file()
    assert mode(shared) == 0o1777
    assert sorted(p.name for p in shared.iterdir()) == ["pagedchat-kv", "report.txt", "x.tmp"]
    assert (shared / "x.tmp").read_bytes() == b"someone else's"
    assert f"{shared} was not made by the tier" in caplog.text and "its own subdirectory" in caplog.text
    assert claim_tier_dir(shared) == own  # the next start finds its subdirectory again


def test_a_link_in_place_of_the_subdirectory_is_refused(tmp_path):
    shared = shared_dir(tmp_path)
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    (shared / SUBDIR).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PermissionError, match=r"pagedchat-kv exists and is not the tier's \(a link"):
        claim_tier_dir(shared)
    assert list(elsewhere.iterdir()) == []


def test_a_subdirectory_open_to_others_is_refused(tmp_path):
    shared = shared_dir(tmp_path)
    (shared / SUBDIR).mkdir(mode=0o777)
    (shared / SUBDIR).chmod(0o777)
    with pytest.raises(PermissionError, match=r"not the tier's \(a directory, owner uid \d+, mode 777"):
        claim_tier_dir(shared)
    assert mode(shared / SUBDIR) == 0o777


@as_root
def test_another_users_subdirectory_or_holder_is_refused(tmp_path):
    shared = shared_dir(tmp_path)
    (shared / SUBDIR).mkdir(mode=0o700)
    os.chown(shared / SUBDIR, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"owner uid {NOBODY}"):
        claim_tier_dir(shared)
    theirs = tmp_path / "theirs"  # a directory of another user (with a marker of theirs): they could swap it
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match=f"belongs to another user \\(uid {NOBODY}\\)"):
        claim_tier_dir(theirs / "kv")
    assert not (theirs / "kv").exists()


def test_a_holder_writable_by_others_and_not_sticky_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(PermissionError, match=r"mode 777\) lets others rename or replace"):
        claim_tier_dir(loose / "kv")
    with pytest.raises(PermissionError, match="lets others rename or replace"):
        claim_tier_dir(loose)  # its subdirectory would be in it
    assert list(loose.iterdir()) == []


def test_an_older_installations_tier_directory_is_taken_over_and_its_unkeyed_blocks_deleted(tmp_path):
    older = tmp_path / "kv"
    older.mkdir(mode=0o700)
    for name in (".lock", block_file(1), block_file(2), block_file(3) + ".77.tmp"):
        (older / name).write_bytes(b"v1")
    assert claim_tier_dir(older) == older
    assert sorted(p.name for p in older.iterdir()) == [".lock", MARKER]


def test_an_older_tier_still_in_use_is_not_taken_over(tmp_path):
    older = tmp_path / "kv"
    older.mkdir(mode=0o700)
    for name in (".lock", block_file(1)):
        (older / name).write_bytes(b"v1")
    with open(older / ".lock", "rb") as held:  # an older server, still running on it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(BlockingIOError, match="another process uses the KV disk tier"):
            claim_tier_dir(older)
    assert sorted(p.name for p in older.iterdir()) == [".lock", block_file(1)]


def test_a_private_directory_with_anything_else_in_it_is_not_taken_over(tmp_path, caplog):
    mine = tmp_path / "kv"
    mine.mkdir(mode=0o700)
    for name in (".lock", block_file(1), "notes.tmp"):
        (mine / name).write_bytes(b"mine")
    with caplog.at_level(logging.WARNING, logger="engine.tiers.tier_dir"):
        assert claim_tier_dir(mine) == mine / SUBDIR
    assert sorted(p.name for p in mine.iterdir()) == [".lock", block_file(1), "notes.tmp", SUBDIR]
    assert f"{mine} holds 1 block files an older version wrote" in caplog.text


def test_only_the_writers_own_temporary_names_count_as_temporaries():
    assert is_block_temporary(block_file(1) + ".4242.tmp")
    assert not is_block_temporary("x.tmp") and not is_block_temporary(block_file(1) + ".tmp")
    assert not is_block_temporary("cut-short.kvb.123.tmp") and not is_block_temporary(block_file(1))


# ---- the key ----------------------------------------------------------------------------------------------------
def test_the_key_is_made_private_once_and_read_back(tmp_path):
    path = tmp_path / "db" / "kv-tier.key"
    key = load_tier_key(path)
    assert len(key) == KEY_BYTES and mode(path) == 0o600
    assert load_tier_key(path) == key
    assert [p.name for p in path.parent.iterdir()] == ["kv-tier.key"]  # no temporary left behind


def test_a_loose_key_is_warned_about_and_a_damaged_one_refused(tmp_path, caplog):
    path = tmp_path / "kv-tier.key"
    key = load_tier_key(path)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="engine.tiers.tier_key"):
        assert load_tier_key(path) == key
    assert f"its key {path} has mode 644" in caplog.text
    path.write_text("not hex\n")
    with pytest.raises(BadTierKey, match="is not a KV tier key"):
        load_tier_key(path)
    path.unlink()
    planted = tmp_path / "planted.key"  # a key someone else knows
    planted.write_text(bytes(KEY_BYTES).hex())
    path.symlink_to(planted)
    with pytest.raises(OSError):  # a link is never followed
        load_tier_key(path)
