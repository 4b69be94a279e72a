"""What produced a block's KV: the weights' bytes and every setting that changes the stored values or their layout.

Two engines whose fingerprints are equal compute the same K/V for the same tokens, byte for byte, so a block one
wrote may be served to the other; anything else (other weights, dtype, KV dtype, quantization, block size, the
pool's layout, the file format) changes the fingerprint, and the tier never reads a block of another fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import xxhash

from engine.tiers.block_file import FINGERPRINT_BYTES, MAGIC

_CHUNK = 1 << 22
# (path, size, mtime_ns, inode) -> content digest: a weights file is hashed once per process and version
_file_digests: dict[tuple[str, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's content (~10 GB/s), remembered per file version for the life of the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    digest = _file_digests.get(key)
    if digest is None:
        h = xxhash.xxh3_128()
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        digest = _file_digests[key] = h.hexdigest()
    return digest


def weight_files(gguf: Path | None, folder: Path | None) -> list[Path]:
    """The files the KV depends on: the GGUF file (metadata included), else the folder's config.json and its
    safetensors/bin shards."""
    if gguf is not None:
        return [gguf]
    assert folder is not None, "a model source has a folder or a GGUF file"
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not files:
        raise RuntimeError(f"no weight files in {folder}")
    config = (
        folder / "config.json"
    )  # rope theta and scaling, norm eps: they shape the stored K as much as weights
    return [config, *files] if config.is_file() else files


def kv_fingerprint(files: list[Path], settings: dict[str, Any]) -> bytes:
    """16 bytes naming the weights' content and the KV-shaping `settings` (JSON-able, e.g. dtype, block_size)."""
    record = {
        "format": MAGIC.decode(),
        "weights": [[p.name, file_digest(p)] for p in files],
        "settings": settings,
        "byteorder": sys.byteorder,
    }
    blob = json.dumps(record, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=FINGERPRINT_BYTES, person=b"kv-fingerprint").digest()
