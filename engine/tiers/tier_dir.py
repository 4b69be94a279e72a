"""Which directory the disk tier may own: the one it was pointed at when the tier made it, else a subdirectory of
its own inside it. The tier deletes, rewrites and chmods only what it owns, so a `--kv-disk-dir` that is shared (mode
1777 like /tmp, holding other people's files) is never tightened or cleaned.

The proof of ownership is a marker file the tier writes into a directory right after making it (0700). A directory
without one is someone else's: the tier works in `<it>/pagedchat-kv/` instead, which must be a real directory (not a
link) of this user with no access for others, or the tier stays off with an error saying why. The directory that
holds the tier's directory must not let others swap it: owned by this user or root, and writable by others only
when sticky (as /tmp is). One exception keeps older installations' directories: a private directory of this user
holding nothing but the files an older version's tier wrote there (its lock, blocks, temporaries) is taken over;
those blocks are of the unkeyed format, which is never served, and are deleted.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

from engine.tiers.block_file import SUFFIX, TMP_SUFFIX, BlockName

logger = logging.getLogger(__name__)

MARKER = ".pagedchat-kv-tier"
SUBDIR = "pagedchat-kv"
LOCK_FILE = ".lock"
_MARKER_TEXT = b"pagedchat KV disk tier: this directory and its files are the tier's own\n"


def claim_tier_dir(configured: Path) -> Path:
    """The directory the tier owns for `configured` (made here when missing); OSError when none can be had safely."""
    configured = Path(os.path.abspath(configured))
    if configured.parent.is_dir():  # before anything is made in it (a missing one is made here, by this user)
        _check_holder(configured.parent, holds=configured)
    if _make_private_dir(configured):
        logger.info("KV disk tier: made %s (0700) and owns it", configured)
        return configured
    if not configured.is_dir():
        raise NotADirectoryError(f"{configured} is not a directory")
    if _has_marker(configured):
        _keep_private(configured)
        return configured
    if _is_older_tier(configured):
        num_removed = _adopt_older_tier(configured)
        logger.warning(
            "KV disk tier: %s holds an older version's tier (unkeyed block files): took it over and deleted its "
            "%d block files, which are never served",
            configured, num_removed,
        )  # fmt: skip
        return configured
    _check_holder(configured, holds=configured / SUBDIR)
    own = configured / SUBDIR
    made = _make_private_dir(own)
    if not made:
        _check_own_subdir(own)
    logger.info(
        "KV disk tier: %s was not made by the tier (its files, mode and owner are left as they are): the tier keeps "
        "to its own subdirectory %s%s",
        configured, own, " (made now, 0700)" if made else "",
    )  # fmt: skip
    num_stale = sum(BlockName.parse(name) is not None for name in os.listdir(configured))
    if num_stale:
        logger.warning(
            "KV disk tier: %s holds %d block files an older version wrote beside other files; they are never served "
            "and the tier leaves them: delete them by hand (rm %s/*%s) to free their space",
            configured, num_stale, configured, SUFFIX,
        )  # fmt: skip
    return own


def _make_private_dir(path: Path) -> bool:
    """Make `path` with mode 0700 and the marker (its parents as usual); False if something is there already."""
    try:
        try:
            os.mkdir(path, 0o700)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    os.chmod(path, 0o700)  # the umask may have taken bits off (never added): 0700 exactly, it is ours
    _write_marker(path)
    return True


def _write_marker(directory: Path) -> None:
    fd = os.open(directory / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_MARKER_TEXT)


def _has_marker(directory: Path) -> bool:
    """The directory and its marker belong to this user, the marker a plain file (not a link someone placed)."""
    try:
        marker = os.lstat(directory / MARKER)
    except FileNotFoundError:
        return False
    uid = os.geteuid()
    return stat.S_ISREG(marker.st_mode) and marker.st_uid == uid and directory.stat().st_uid == uid


def _keep_private(directory: Path) -> None:
    """A directory the tier made: back to 0700 if someone opened it up since."""
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077:
        os.chmod(directory, 0o700)
        logger.warning("KV disk tier: %s (the tier's own) had mode %o: set back to 0700", directory, mode)


def _check_holder(holder: Path, *, holds: Path) -> None:
    """`holder` must not let another user swap `holds` (rename it away, put a link or a directory of theirs)."""
    st = holder.stat()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(
            f"{holder} belongs to another user (uid {st.st_uid}), who could replace the tier's directory {holds}: "
            "point --kv-disk-dir at a directory of your own"
        )
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise PermissionError(
            f"{holder} (mode {mode:o}) lets others rename or replace the tier's directory {holds}: make it sticky "
            "(chmod +t) or not writable by others, or point --kv-disk-dir elsewhere"
        )


def _check_own_subdir(own: Path) -> None:
    """An existing `<dir>/pagedchat-kv`: used only when it is this user's private directory, not a link."""
    st = os.lstat(own)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or mode & 0o077:
        kind = (
            "a directory" if stat.S_ISDIR(st.st_mode) else "a link" if stat.S_ISLNK(st.st_mode) else "a file"
        )
        raise PermissionError(
            f"{own} exists and is not the tier's ({kind}, owner uid {st.st_uid}, mode {mode:o}; the tier needs a "
            f"directory of uid {os.geteuid()} with mode 0700): remove it, or point --kv-disk-dir elsewhere"
        )
    if not _has_marker(own):  # made by the tier, which stopped before writing the marker
        _write_marker(own)


def _is_tier_file(name: str) -> bool:
    """A name the tier's files have: its lock, a block, or a block's temporary (`<block>.kvb.<pid>.tmp`)."""
    if name == LOCK_FILE or BlockName.parse(name) is not None:
        return True
    return name.endswith(TMP_SUFFIX) and is_block_temporary(name)


def is_block_temporary(name: str) -> bool:
    """Whether `name` is a block's temporary file, as the tier's writer names them."""
    stem, _, pid = name[: -len(TMP_SUFFIX)].rpartition(".")
    return name.endswith(TMP_SUFFIX) and pid.isdigit() and BlockName.parse(stem) is not None


def _is_older_tier(directory: Path) -> bool:
    """A private directory of this user holding an older tier's lock and nothing but tier files."""
    st = directory.stat()
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        return False
    names = os.listdir(directory)
    return LOCK_FILE in names and all(_is_tier_file(n) and not os.path.islink(directory / n) for n in names)


def _adopt_older_tier(directory: Path) -> int:
    """Delete the older tier's blocks and mark the directory, holding its lock: an older server still running on it
    keeps its files (BlockingIOError, and this tier stays off)."""
    lock_fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_NOFOLLOW)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BlockingIOError(f"another process uses the KV disk tier at {directory}") from None
        num_removed = 0
        for name in os.listdir(directory):
            if name.endswith(SUFFIX) or name.endswith(TMP_SUFFIX):
                os.unlink(directory / name)
                num_removed += name.endswith(SUFFIX)
        _write_marker(directory)
    finally:
        os.close(lock_fd)  # the flock goes with it
    return num_removed
