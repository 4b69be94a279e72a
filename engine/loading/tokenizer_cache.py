"""GGUF tokenizers kept once built. transformers builds a GGUF file's tokenizer from the file's metadata in Python:
1.6 s for a 128k vocabulary, 0.8 s for SmolLM2's 49k (2-core AMD EPYC, Zen 3). Reading back a pickled copy takes a
third of that. So each file's tokenizer is pickled once under the cache dir, keyed by the file (its path, size and
modification time) and the transformers and tokenizers versions, and a model loaded again (several models, a
restart) reads it from there.

A pickle, not `save_pretrained`: read back through its class, a saved tokenizer is not always the one built (Qwen2's
class puts its own normalizer and pre-tokenizer in place of the file's). The cache dir is the operator's, as trusted
as the kernels compiled into it (engine/native/build.py), which this process loads too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from engine.core.paths import cache_dir

logger = logging.getLogger(__name__)
FORMAT = 1  # bumped when what is kept changes
MAX_KEPT = 16  # tokenizers kept at most (a 128k vocabulary's is ~5 MB): the least recently read go first


def tokenizer_file(path: Path) -> Path:
    """Where the tokenizer of the GGUF file `path` is kept."""
    import tokenizers
    import transformers

    stat = path.stat()
    key = f"{FORMAT}|{path}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}|{tokenizers.__version__}"
    return cache_dir() / "tokenizers" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.pickle"


def read_saved(path: Path) -> Any | None:
    """The tokenizer kept for `path`; None when none was kept, or when it cannot be read (logged, and the copy
    deleted: the caller builds it again)."""
    kept = tokenizer_file(path)
    try:
        with kept.open("rb") as f:
            tokenizer = pickle.load(f)  # noqa: S301 - written by save() into the operator's own cache dir
        os.utime(kept)  # read now: the last to go when the cache is pruned
        return tokenizer
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a damaged copy: build it again from the file
        logger.warning("the kept tokenizer %s cannot be read (%s): building it again", kept, exc)
        kept.unlink(missing_ok=True)
        return None


def save(path: Path, tokenizer: Any) -> None:
    """Keep `tokenizer` for `path`: written beside its place, then renamed into it (two processes building the same
    one at once: the last rename wins, with the same contents). A failure is logged, never raised: the cache only
    saves time."""
    kept = tokenizer_file(path)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=kept.parent, prefix=".saving-")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(tokenizer, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(staging, kept)
        finally:
            Path(staging).unlink(missing_ok=True)  # gone when the rename happened
        prune(kept.parent)
    except (OSError, pickle.PicklingError) as exc:
        logger.debug("the tokenizer of %s was not kept in %s: %s", path, kept, exc)


def prune(folder: Path, keep: int = MAX_KEPT) -> None:
    """Delete all but the `keep` most recently read or written tokenizers of `folder`."""
    kept = sorted(folder.glob("*.pickle"), key=lambda f: f.stat().st_mtime_ns, reverse=True)
    for old in kept[keep:]:
        old.unlink(missing_ok=True)
