"""One KV block on disk: a fixed header (what produced it, whose chain it is, a checksum) and the block's bytes.

A file is written under a temporary name and renamed into place, so a reader sees a whole file or none; what can
still go wrong (a torn write after a power cut, a flipped bit, a truncated copy) is caught by the checksum, an
xxh3-128 over the header fields and the payload. A file whose checksum, size or identity does not match is never
served: the reader raises `CorruptBlock` and the tier drops it.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass

import xxhash

from engine.core.hash_chain import SALT_TAG_BYTES

MAGIC = b"PCKVBLK1"  # the format's version is its last byte
SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"
FINGERPRINT_BYTES = 16
# magic, fingerprint, block hash, salt tag, payload bytes; then the checksum of all that and the payload
_FIELDS = struct.Struct(f"<8s{FINGERPRINT_BYTES}s16s{SALT_TAG_BYTES}sQ")
HEADER_BYTES = _FIELDS.size + 16


class CorruptBlock(ValueError):
    """A block file that is torn, truncated, altered, or made by other weights or settings."""


@dataclass(frozen=True)
class BlockName:
    """What a block file's name says: the producer's fingerprint, the tenant's salt tag and the chain hash."""

    fingerprint: bytes
    salt_tag: bytes
    block_hash: bytes

    @property
    def filename(self) -> str:
        return f"{self.fingerprint.hex()}-{self.salt_tag.hex()}-{self.block_hash.hex()}{SUFFIX}"

    @staticmethod
    def parse(filename: str) -> BlockName | None:
        """The name's parts, or None for a file that is not a block (a leftover temporary, a stranger)."""
        if not filename.endswith(SUFFIX):
            return None
        parts = filename[: -len(SUFFIX)].split("-")
        if len(parts) != 3:
            return None
        try:
            fingerprint, salt_tag, block_hash = (bytes.fromhex(p) for p in parts)
        except ValueError:
            return None
        if len(fingerprint) != FINGERPRINT_BYTES or len(salt_tag) != SALT_TAG_BYTES or len(block_hash) != 16:
            return None
        return BlockName(fingerprint, salt_tag, block_hash)


def _checksum(fields: bytes, payload: memoryview | bytes) -> bytes:
    h = xxhash.xxh3_128(fields)
    h.update(payload)
    return h.digest()


def write_block_file(directory: str, name: BlockName, payload: memoryview | bytes) -> int:
    """Write one block atomically (temporary file, fsync-free rename) with mode 0600; returns the file's size."""
    fields = _FIELDS.pack(MAGIC, name.fingerprint, name.block_hash, name.salt_tag, len(payload))
    final = os.path.join(directory, name.filename)
    tmp = f"{final}.{os.getpid()}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=True) as f:
            f.write(fields)
            f.write(_checksum(fields, payload))
            f.write(payload)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return HEADER_BYTES + len(payload)


def read_block_file(path: str, name: BlockName, payload_bytes: int) -> memoryview:
    """The payload of a block file, checked against `name` and its checksum; CorruptBlock when anything differs.

    OSError (gone, unreadable) passes through: the caller treats it as a miss.
    """
    buffer = bytearray(HEADER_BYTES + payload_bytes)
    with open(path, "rb", buffering=0) as f:
        n = f.readinto(buffer)
        extra = f.read(1)
    if n != len(buffer) or extra:
        raise CorruptBlock(
            f"{os.path.basename(path)}: {n}{'+' if extra else ''} bytes, expected {len(buffer)}"
        )
    view = memoryview(buffer)
    fields, checksum, payload = view[: _FIELDS.size], view[_FIELDS.size : HEADER_BYTES], view[HEADER_BYTES:]
    magic, fingerprint, block_hash, salt_tag, size = _FIELDS.unpack(fields)
    if magic != MAGIC:
        raise CorruptBlock(f"{os.path.basename(path)}: not a block file of this version")
    if (fingerprint, block_hash, salt_tag, size) != (
        name.fingerprint,
        name.block_hash,
        name.salt_tag,
        payload_bytes,
    ):
        raise CorruptBlock(f"{os.path.basename(path)}: its header names another block or producer")
    if _checksum(fields, payload) != bytes(checksum):
        raise CorruptBlock(f"{os.path.basename(path)}: checksum mismatch")
    return payload
