"""Hub ids (`org/name`): a model repo resolved through huggingface_hub's cache, fetching only the files the engine
loads (config, tokenizer, safetensors; or one GGUF file).

huggingface_hub owns the cache (`HF_HOME`, `HF_HUB_CACHE`), the endpoint (`HF_ENDPOINT`), tokens (`HF_TOKEN`),
offline mode (`HF_HUB_OFFLINE`) and the download progress bars (tqdm, on stderr). Every failure a user can meet (no
network, no such repo or revision, a gated or private repo, no loadable weights) becomes one ValueError line.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# what the engine reads from a safetensors repo besides the weights (transformers' names)
META_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
)


def is_repo_id(name: str) -> bool:
    """True when `name` has the shape of a hub model id (`org/name`); says nothing of whether the repo exists."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name.count("/") != 1 or name.endswith(".gguf"):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def choose_files(repo_id: str, files: list[str], gguf_file: str = "") -> tuple[list[str], str | None]:
    """The repo paths to fetch and, for a GGUF model, the GGUF file among them (None: a safetensors folder).

    `gguf_file` picks a GGUF file by its path or file name; unset, safetensors win when the repo has them (config.json
    beside `*.safetensors` at the top), else its one .gguf file. ValueError names the files when none fits.
    """
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if gguf_file:
        matches = [f for f in ggufs if f == gguf_file or f.rsplit("/", 1)[-1] == gguf_file]
        if len(matches) != 1:
            found = (
                f"several GGUF files named {gguf_file!r} (give its path)"
                if matches
                else f"no GGUF file {gguf_file!r}"
            )
            raise ValueError(f"model repo {repo_id!r} has {found}; its GGUF files: {_listing(ggufs)}")
        return matches, matches[0]
    top = [f for f in files if "/" not in f]
    weights = safetensors_weights(top)
    if weights and "config.json" in top:
        meta = [f for f in top if any(fnmatch.fnmatchcase(f, p) for p in META_PATTERNS)]
        index = [f for f in top if f.endswith(".safetensors.index.json")]
        return sorted({*meta, *index, *weights}), None
    if len(ggufs) == 1:
        return ggufs, ggufs[0]
    if ggufs:
        raise ValueError(
            f"model repo {repo_id!r} holds {len(ggufs)} GGUF files: choose one with --gguf-file "
            f"(PAGEDCHAT_GGUF_FILE): {_listing(ggufs)}"
        )
    raise ValueError(
        f"model repo {repo_id!r} has no weights pagedchat loads (config.json with *.safetensors, or a .gguf "
        f"file); its files: {_listing(files)}"
    )


def safetensors_weights(top: list[str]) -> list[str]:
    """The top-level safetensors shards transformers would load: `model*.safetensors` when the repo has them
    (Mistral repos also carry a `consolidated.safetensors` copy), else every `*.safetensors`."""
    shards = [f for f in top if f.endswith(".safetensors")]
    named = [f for f in shards if f.startswith("model")]
    return named or shards


def _listing(files: list[str], limit: int = 20) -> str:
    shown = ", ".join(files[:limit]) or "none"
    return shown + (f", ... ({len(files) - limit} more)" if len(files) > limit else "")


def fetch_if_hub_id(model: str, *, revision: str = "", gguf_file: str = "") -> Path | None:
    """Download a hub id's files now, in the CLI's process (its progress bar, its one-line error) before a server
    starts; None for a local path or the default model's name, which the engine resolves itself."""
    if Path(model).expanduser().exists() or not is_repo_id(model):
        check_local_options(model, revision=revision, gguf_file=gguf_file)
        return None
    return resolve_hub_model(model, revision=revision, gguf_file=gguf_file)


def check_local_options(model: str, *, revision: str = "", gguf_file: str = "") -> None:
    """ValueError when a hub-only option is given for a model that is not a hub id."""
    if revision or gguf_file:
        flag = "--revision (PAGEDCHAT_MODEL_REVISION)" if revision else "--gguf-file (PAGEDCHAT_GGUF_FILE)"
        raise ValueError(f"{flag} applies to hub ids (org/name), not to the local model {model!r}")


def resolve_hub_model(repo_id: str, *, revision: str = "", gguf_file: str = "") -> Path:
    """The local snapshot folder (safetensors) or GGUF file of hub repo `repo_id` at `revision` (unset: main),
    downloaded into huggingface_hub's cache on first use; offline or unreachable, the cached copy is used."""
    from huggingface_hub import constants, snapshot_download

    revision = revision or constants.DEFAULT_REVISION
    where = _where(repo_id, revision)
    files, offline_reason = _list_files(repo_id, revision)
    wanted, gguf = choose_files(repo_id, files, gguf_file)
    local_only = offline_reason is not None
    if local_only:
        logger.warning("%s: using the cached copy of %s", offline_reason, where)
    else:
        logger.info(  # files already in the cache are not downloaded again
            "model %s from %s, cache %s: %s",
            where,
            constants.ENDPOINT,
            constants.HF_HUB_CACHE,
            ", ".join(wanted),
        )
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=[glob.escape(f) for f in wanted],
            local_files_only=local_only,
        )
    except _hub_failures() as exc:
        raise hub_error(exc, repo_id, revision) from exc
    path = Path(folder)
    return path / gguf if gguf is not None else path


def _where(repo_id: str, revision: str) -> str:
    from huggingface_hub import constants

    return f"{repo_id!r}" + (f" at revision {revision!r}" if revision != constants.DEFAULT_REVISION else "")


def _hub_failures() -> tuple[type[BaseException], ...]:
    """The exceptions huggingface_hub raises for what a user can meet: HTTP answers, cache misses, the network,
    the disk. Anything else is a bug and keeps its traceback."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    return (HfHubHTTPError, LocalEntryNotFoundError, httpx2.TransportError, OSError)


def _list_files(repo_id: str, revision: str) -> tuple[list[str], str | None]:
    """The repo's file paths, and why the cache answered instead of the hub (None: the hub answered)."""
    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        return _cached_files(repo_id, revision, "HF_HUB_OFFLINE is set"), "HF_HUB_OFFLINE is set"
    try:
        info = HfApi().model_info(repo_id, revision=revision)
    except _hub_failures() as exc:
        if not _is_unreachable(exc):
            raise hub_error(exc, repo_id, revision) from exc
        reason = f"cannot reach the hub at {constants.ENDPOINT} ({_first_line(exc)})"
        return _cached_files(repo_id, revision, reason), reason
    return [s.rfilename for s in info.siblings or []], None


def _cached_files(repo_id: str, revision: str, reason: str) -> list[str]:
    """The file list cached by an earlier download at `revision`; ValueError when there was none."""
    from huggingface_hub import constants, get_cached_repo_tree, snapshot_download
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, LocalEntryNotFoundError

    try:
        return [f.path for f in get_cached_repo_tree(repo_id, revision=revision)]
    except CachedRepoTreeNotFoundError:
        pass
    try:  # a snapshot from a huggingface_hub that kept no tree listing: its files are the list
        folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ValueError(
            f"{reason}, and model {_where(repo_id, revision)} is not in the cache {constants.HF_HUB_CACHE}: "
            "download it once with network access"
        ) from None
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _is_unreachable(exc: BaseException) -> bool:
    """The hub could not be asked (connection refused, DNS, timeout, proxy), as opposed to answering no."""
    import httpx2  # huggingface_hub's HTTP client

    return isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError))


def hub_error(exc: BaseException, repo_id: str, revision: str) -> ValueError:
    """One line saying what went wrong for the user, from huggingface_hub's exception."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    where = _where(repo_id, revision)
    login = "log in with `hf auth login` or set HF_TOKEN"
    if isinstance(exc, RevisionNotFoundError):
        return ValueError(f"model repo {repo_id!r} on {endpoint} has no revision {revision!r}")
    if isinstance(exc, GatedRepoError):
        return ValueError(
            f"model repo {repo_id!r} is gated: accept its terms at {endpoint}/{repo_id}, then {login}"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ValueError(
            f"no model {repo_id!r}: not a local path, and no such repo on {endpoint} (a private repo needs a token: "
            f"{login})"
        )
    if (
        isinstance(exc, HfHubHTTPError)
        and exc.response is not None
        and exc.response.status_code in (401, 403)
    ):
        return ValueError(
            f"model repo {repo_id!r} on {endpoint}: access denied ({exc.response.status_code}); {login}"
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "an error"
        return ValueError(f"the hub at {endpoint} answered {status} for model {where}: {_first_line(exc)}")
    if isinstance(exc, IncompleteSnapshotError):
        return ValueError(
            f"the cached copy of model {where} in {constants.HF_HUB_CACHE} is incomplete and the hub cannot be "
            "reached: download it once more with network access"
        )
    if isinstance(exc, LocalEntryNotFoundError) or _is_unreachable(exc):
        return ValueError(
            f"cannot fetch model {where} from {endpoint} ({_first_line(exc)}), and it is not in the cache "
            f"{constants.HF_HUB_CACHE}"
        )
    # disk full, permissions on the cache, a file the hub sent short
    return ValueError(f"fetching model {where} into {constants.HF_HUB_CACHE} failed: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
