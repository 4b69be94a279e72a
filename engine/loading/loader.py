"""Finding a model (folder, GGUF file or hub id), building the model from a folder, and reading its tokenizer and EOS ids."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from engine.core.config import EngineConfig
from engine.loading.gguf import gguf_hf_config, is_gguf_file, load_gguf_tokenizer, open_gguf
from engine.loading.gguf_file import GGUFFile
from engine.loading.hub import check_local_options, is_repo_id, resolve_hub_model, safetensors_weights
from engine.loading.light_config import light_folder_config, names_its_tokenizer
from engine.loading.provision import DEFAULT_MODEL_NAME, provision_default_model
from engine.models.llama import LlamaForCausalLM, ModelArgs

logger = logging.getLogger(__name__)


def resolve_model_path(name_or_path: str, *, revision: str = "", gguf_file: str = "") -> Path:
    """A local HF folder (config.json + *.safetensors) or GGUF file as is, the default model's folder, or a hub id's
    snapshot folder or GGUF file (huggingface_hub's cache; `revision` and `gguf_file` apply to hub ids only)."""
    path = Path(name_or_path).expanduser()
    local = path.suffix == ".gguf" or path.is_dir() or name_or_path == DEFAULT_MODEL_NAME
    if local:
        check_local_options(name_or_path, revision=revision, gguf_file=gguf_file)
    if path.suffix == ".gguf":
        return check_gguf_path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {path} has no config.json")
        if not any(path.glob("*.safetensors")):
            raise ValueError(f"model folder {path} has no *.safetensors weights")
        return path
    if name_or_path == DEFAULT_MODEL_NAME:
        return provision_default_model(name_or_path)
    if is_repo_id(name_or_path):
        return resolve_hub_model(name_or_path, revision=revision, gguf_file=gguf_file)
    raise ValueError(
        f"model {name_or_path!r} is neither a local folder with config.json and *.safetensors, nor a .gguf file, "
        f"nor a hub id (org/name), nor the provisioned name {DEFAULT_MODEL_NAME!r}"
    )


def resolve_config_model(config: EngineConfig) -> Path:
    """`resolve_model_path` of the config's model, with its revision and GGUF file."""
    return resolve_model_path(config.model, revision=config.model_revision, gguf_file=config.gguf_file)


def check_gguf_path(path: Path) -> Path:
    """`path` when it is a readable GGUF file; ValueError naming what is wrong otherwise."""
    if not path.exists():
        raise ValueError(f"GGUF model file {path} does not exist")
    if not is_gguf_file(path):
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic bytes at its start)")
    return path


def load_hf_config(path: Path) -> Any:
    """The transformers config of a model folder (a light one where that reads the same: see light_config), or the
    config of a GGUF file's metadata."""
    if Path(path).suffix == ".gguf":
        return gguf_hf_config(open_gguf(path))
    light = light_folder_config(path)
    if light is not None:
        return light
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def load_generation_config(path: Path) -> Any | None:
    """The folder's generation_config.json as a GenerationConfig, or None when it has none (or is a GGUF file)."""
    from transformers import GenerationConfig

    if not (Path(path) / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(str(path))


def load_tokenizer(path: Path, reader: GGUFFile | None = None) -> Any:
    """The folder's tokenizer (fast when available), or the one built from a GGUF file's metadata (`reader`: the
    file, parsed already)."""
    from transformers import AutoTokenizer

    if Path(path).suffix == ".gguf":
        return load_gguf_tokenizer(path, reader)
    # AutoTokenizer loads the model's config (AutoConfig) to choose a class unless it is given one
    light = light_folder_config(path) if names_its_tokenizer(path) else None
    if light is not None:
        return AutoTokenizer.from_pretrained(str(path), config=light)
    return AutoTokenizer.from_pretrained(str(path))


def iter_safetensors(path: Path):
    """Yield (name, tensor) from the folder's weight files, in name order: those its index names, else the ones
    transformers would load (a hub snapshot may also hold e.g. Mistral's `consolidated.safetensors` copy)."""
    import json

    from safetensors import safe_open

    index = Path(path) / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        names = sorted(safetensors_weights([f.name for f in Path(path).glob("*.safetensors")]))
    for file in (Path(path) / name for name in names):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, handle.get_tensor(name)


def load_model(
    path: Path, dtype: torch.dtype, device: torch.device, *, max_model_len: int | None = None
) -> tuple[LlamaForCausalLM, Any]:
    """Build the model from config.json, load its safetensors cast to dtype on device; eval mode, no grad."""
    start = time.monotonic()
    hf_config = load_hf_config(path)
    args = ModelArgs.from_hf_config(hf_config, max_model_len=max_model_len)
    with torch.device("meta"):  # no random init: every weight is overwritten by the checkpoint
        model = LlamaForCausalLM(args).to(dtype)
    model = model.materialize(device)
    model.load_weights(iter_safetensors(path))
    model.eval().requires_grad_(False)
    logger.info("loaded %s (%s, %s) in %.1f s", path, dtype, device, time.monotonic() - start)
    return model, hf_config


def _as_ids(value: int | list[int] | None) -> set[int]:
    if value is None:
        return set()
    return {int(value)} if isinstance(value, int) else {int(v) for v in value}


def eos_token_ids(
    hf_config: Any, generation_config: Any | Path | None, tokenizer: Any | None
) -> frozenset[int]:
    """Union of the config's, the generation config's (or the model folder's) and the tokenizer's EOS ids."""
    if isinstance(generation_config, (str, Path)):
        generation_config = load_generation_config(Path(generation_config))
    ids = _as_ids(getattr(hf_config, "eos_token_id", None))
    if generation_config is not None:
        ids |= _as_ids(getattr(generation_config, "eos_token_id", None))
    if tokenizer is not None:
        ids |= _as_ids(getattr(tokenizer, "eos_token_id", None))
    if not ids:
        raise ValueError("the model declares no eos token id in its config, generation config or tokenizer")
    return frozenset(ids)
