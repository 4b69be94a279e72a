"""The suite builds hundreds of engines on a handful of models, and loading a model's tokenizer is most of a tiny
engine's build: ~1 s for SmolLM2's, from its folder. Here the engine's loader takes a copy of a tokenizer already
loaded in this process instead (a deepcopy, ~0.2 s, as the app's bridge makes for itself); each model's first load is
the real one. Only the engine's loader (engine/loading/engine_model.py) goes through it: the tests of tokenizer
loading call the loading functions themselves. The e2e zygote installs it and loads the tiny models' tokenizers before
it forks servers (tests/e2e/zygote.py), and each pytest worker installs it (tests/conftest.py)."""

from __future__ import annotations

import copy
import functools
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEPT = 8  # tokenizers kept, the least recently used going first (many tests write a GGUF file of their own)
_LOADED: OrderedDict[tuple[str, str, tuple[tuple[str, int, int], ...]], Any] = OrderedDict()


def _files(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What a tokenizer is read from, as names, sizes and modification times: a file, or a folder's files."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return tuple((f.name, (s := f.stat()).st_size, s.st_mtime_ns) for f in files)


def remembering(load: Callable[..., Any]) -> Callable[..., Any]:
    """`load(path, ...)` whose result is kept per path and contents; every call gets its own copy."""
    if getattr(load, "remembers", False):
        return load

    @functools.wraps(load)
    def wrapped(path: str | os.PathLike[str], *args: Any) -> Any:
        resolved = Path(path).expanduser().resolve()
        key = (load.__name__, str(resolved), _files(resolved))
        if key not in _LOADED:
            _LOADED[key] = load(path, *args)
            while len(_LOADED) > KEPT:
                _LOADED.popitem(last=False)
        _LOADED.move_to_end(key)
        return copy.deepcopy(_LOADED[key])

    wrapped.remembers = True  # type: ignore[attr-defined]
    return wrapped


def install() -> None:
    """The engine's loader loads each tokenizer once per process."""
    from engine.loading import engine_model

    engine_model.load_tokenizer = remembering(engine_model.load_tokenizer)
