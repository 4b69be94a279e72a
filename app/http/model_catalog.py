"""Which models a server serves (`--model`, `--models`, `--models-dir`), by the id the API gives each, and what
each will take in memory before it loads."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from app.settings import Settings, split_alias
from engine.core.config import DEFAULT_MODEL, EngineConfig
from engine.core.paths import cache_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class ModelEntry:
    """One served model: the id requests name it by, and what `--model` takes to load it."""

    name: str
    source: str

    def config(self, base: EngineConfig) -> EngineConfig:
        """The engine config that loads this model: `base` (the server's engine flags) with its source."""
        return dataclasses.replace(base, model=self.source)


def served_name(source: str) -> str:
    """The id a model is served as without an alias: a local file's or folder's name, else what was given."""
    path = Path(source).expanduser()
    return path.name if path.exists() else source


def model_entries(settings: Settings) -> tuple[ModelEntry, ...]:
    """The served models, `--model` first; ValueError for a model file or folder that is not there, two models of
    one id, or a missing `--models-dir`. A file the folder holds that is served already (as `--model`, say) is
    served once."""
    first = settings.engine.model
    entries = [ModelEntry(settings.served_model_name or served_name(first), first)]
    for text in settings.models:
        alias, source = split_alias(text)
        check_local(source)
        entries.append(ModelEntry(alias or served_name(source), source))
    if settings.models_dir:
        given = {_resolved(e.source) for e in entries}
        entries.extend(
            e
            for e in scan_models_dir(Path(settings.models_dir).expanduser())
            if _resolved(e.source) not in given
        )
    seen: dict[str, str] = {}
    for entry in entries:
        if entry.name in seen:
            raise ValueError(
                f"two models are served as {entry.name!r} ({seen[entry.name]} and {entry.source}); give each its "
                "own name as NAME=MODEL"
            )
        seen[entry.name] = entry.source
    return tuple(entries)


def check_local(source: str) -> None:
    """ValueError for a model that names a local file or folder (a path, a .gguf file) which is not there; a hub id
    (org/name) is fetched when it loads."""
    path = Path(source).expanduser()
    looks_local = source.endswith(".gguf") or source.startswith(("/", "./", "../", "~"))
    if looks_local and not path.exists():
        raise ValueError(f"model {source!r} does not exist")


def _resolved(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def scan_models_dir(folder: Path) -> list[ModelEntry]:
    """Each loadable model in `folder`, by name: .gguf files, and folders with a config.json beside their weights
    (a .gguf file inside a folder is that folder's model when the folder has no config.json)."""
    if not folder.is_dir():
        raise ValueError(f"models_dir {folder} is not a folder")
    found = []
    for path in sorted(folder.iterdir()):
        gguf_file = path.suffix == ".gguf" and path.is_file()
        hf_folder = path.is_dir() and (path / "config.json").is_file() and bool(_weight_files(path))
        if gguf_file or hf_folder:
            found.append(ModelEntry(path.name, str(path)))
        elif path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                found.append(ModelEntry(path.name, str(ggufs[0])))
    return found


def weight_files(source: str) -> list[Path]:
    """The files the model's weights load from; none where they are not on disk yet (a hub id not fetched)."""
    path = Path(source).expanduser()
    if source == DEFAULT_MODEL and not path.exists():
        path = cache_dir() / "models" / DEFAULT_MODEL
        ggufs = sorted(path.glob("*.gguf")) if path.is_dir() else []
        return ggufs[:1]
    if path.is_file():
        return [path]
    return _weight_files(path) if path.is_dir() else []


def weight_file_bytes(source: str) -> int | None:
    """Bytes of the files the model's weights load from (a good measure of what they take once loaded: blocks are
    kept as they are); None where they are not on disk yet (a hub id not fetched)."""
    stats = _weight_stats(source)
    return sum(s.st_size for s in stats) if stats else None


def weights_written_at(source: str) -> int | None:
    """When the model's weight files were last written (Unix seconds: OpenAI's `created`); None: not on disk."""
    stats = _weight_stats(source)
    return int(max(s.st_mtime for s in stats)) if stats else None


def _weight_stats(source: str) -> list[os.stat_result]:
    """The weight files' stats; a file or folder removed (or replaced, or unreadable) since it was listed is left
    out (a model being replaced on disk while /v1/models is asked: no 500)."""
    try:
        files = weight_files(source)
    except OSError:
        return []
    stats = []
    for f in files:
        with contextlib.suppress(OSError):
            stats.append(f.stat())
    return stats


def _weight_files(folder: Path) -> list[Path]:
    return [f for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file()]
