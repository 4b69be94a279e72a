"""One KV block on disk: a fixed header (what produced it, whose chain it is, a nonce, a MAC) and the block's bytes.

A file is written under a temporary name and renamed into place, so a reader sees a whole file or none. The MAC is
Poly1305 over the header fields and the payload, under a one-time key that BLAKE2b derives from the installation's
secret (engine/tiers/tier_key.py) and the file's random nonce: a torn write, a flipped bit, a truncated copy, and a
file written or rewritten by anyone without the secret (a checksum they recompute included) all fail it. A file whose
MAC, size or identity does not match is never served: the reader raises `CorruptBlock` and the tier drops it.
Poly1305 runs at several GB/s, near the xxh3 checksum of format 1 (whose files, unkeyed, are never read).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.poly1305 import Poly1305

from engine.core.block_names import FINGERPRINT_BYTES, SUFFIX, BlockName
from engine.core.hash_chain import SALT_TAG_BYTES

__all__ = ["FINGERPRINT_BYTES", "SUFFIX", "BlockName"]  # the names, kept in engine/core/block_names.py
MAGIC = b"PCKVBLK2"  # the format's version is its last byte (1: an unkeyed xxh3 checksum)
TMP_SUFFIX = ".tmp"
NONCE_BYTES = 16
MAC_BYTES = 16
# magic, fingerprint, block hash, salt tag, payload bytes, nonce; then the MAC of all that and the payload
_FIELDS = struct.Struct(f"<8s{FINGERPRINT_BYTES}s16s{SALT_TAG_BYTES}sQ{NONCE_BYTES}s")
HEADER_BYTES = _FIELDS.size + MAC_BYTES
_KDF_PERSON = b"pagedchat-kvmac"


class CorruptBlock(ValueError):
    """A block file that is torn, truncated, altered, or made by other weights or settings."""


def _mac(key: bytes, fields: bytes | memoryview, payload: memoryview | bytes) -> bytes:
    """Poly1305 is a one-time MAC: each file's key comes from the secret and the file's own random nonce (in
    `fields`), as NaCl derives one per message."""
    nonce = bytes(fields[-NONCE_BYTES:])
    one_time_key = hashlib.blake2b(nonce, key=key, digest_size=32, person=_KDF_PERSON).digest()
    mac = Poly1305(one_time_key)
    mac.update(fields)
    mac.update(payload)
    return mac.finalize()


def write_block_file(directory: str, name: BlockName, payload: memoryview | bytes, key: bytes) -> int:
    """Write one block atomically (temporary file, fsync-free rename) with mode 0600, its MAC under `key`; returns
    the file's size."""
    nonce = os.urandom(NONCE_BYTES)
    fields = _FIELDS.pack(MAGIC, name.fingerprint, name.block_hash, name.salt_tag, len(payload), nonce)
    final = os.path.join(directory, name.filename)
    tmp = f"{final}.{os.getpid()}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=True) as f:
            f.write(fields)
            f.write(_mac(key, fields, payload))
            f.write(payload)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return HEADER_BYTES + len(payload)


def read_block_file(path: str, name: BlockName, payload_bytes: int, key: bytes) -> memoryview:
    """The payload of a block file, checked against `name` and its MAC under `key`; CorruptBlock when anything
    differs.

    OSError (gone, unreadable) passes through: the caller treats it as a miss.
    """
    buffer = bytearray(HEADER_BYTES + payload_bytes)
    with open(path, "rb", buffering=0, opener=_open_no_follow) as f:
        n = f.readinto(buffer)
        extra = f.read(1)
    if n != len(buffer) or extra:
        raise CorruptBlock(
            f"{os.path.basename(path)}: {n}{'+' if extra else ''} bytes, expected {len(buffer)}"
        )
    view = memoryview(buffer)
    fields, mac, payload = view[: _FIELDS.size], view[_FIELDS.size : HEADER_BYTES], view[HEADER_BYTES:]
    magic, fingerprint, block_hash, salt_tag, size, _nonce = _FIELDS.unpack(fields)
    if magic != MAGIC:
        raise CorruptBlock(f"{os.path.basename(path)}: not a block file of this version")
    if (fingerprint, block_hash, salt_tag, size) != (
        name.fingerprint,
        name.block_hash,
        name.salt_tag,
        payload_bytes,
    ):
        raise CorruptBlock(f"{os.path.basename(path)}: its header names another block or producer")
    if not hmac.compare_digest(_mac(key, fields, payload), bytes(mac)):
        raise CorruptBlock(
            f"{os.path.basename(path)}: MAC mismatch (damaged, or written without the tier's key)"
        )
    return payload


def _open_no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
