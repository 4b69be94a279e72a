"""Everything LLMEngine needs from a model name: the source (folder or GGUF file), the resolved config, the model,
its tokenizer, EOS ids and sampling defaults."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.core.config import EngineConfig
from engine.core.resolve import Machine, ModelFacts, resolve_config, resolve_device, resolve_quantization
from engine.core.sampling_defaults import SamplingDefaults, from_generation_config
from engine.loading.gguf import gguf_hf_config, layer_linears_in_blocks, load_gguf_model, open_gguf
from engine.loading.loader import (
    eos_token_ids,
    load_generation_config,
    load_hf_config,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from engine.loading.provision import DEFAULT_MODEL_NAME, provision_default_gguf
from engine.models.llama import LlamaForCausalLM, ModelArgs
from engine.models.quantized import native_int8_kernels

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: weights from `gguf` when set, else from `folder`; config, tokenizer and
    generation config from `folder` when there is one, else from the GGUF file's metadata."""

    name: str  # the name the engine serves the model under
    folder: Path | None
    gguf: Path | None

    def __post_init__(self) -> None:
        assert self.folder is not None or self.gguf is not None, (
            "a model source needs a folder or a GGUF file"
        )

    @property
    def meta_path(self) -> Path:
        """Where the tokenizer and generation config are read from."""
        return self.folder if self.folder is not None else self.gguf  # type: ignore[return-value]


@dataclass(frozen=True)
class EngineModel:
    """What LLMEngine.__init__ takes from loading: the resolved config and the loaded pieces."""

    config: EngineConfig  # resolved (engine/core/resolve.py): device, dtype, quantization... concrete
    dtype: torch.dtype  # config.dtype's
    model: LlamaForCausalLM
    hf_config: Any
    tokenizer: Any
    eos_token_ids: frozenset[int]
    model_name: str
    source: ModelSource
    sampling_defaults: SamplingDefaults  # what the model's generation_config.json sets (empty without one)


def resolve_model_source(config: EngineConfig, device: str) -> ModelSource:
    """The source of `config.model`: a .gguf file, an HF folder, or the default model's folder and GGUF file.

    The default model's GGUF file is wanted when quantization resolves to gguf for it (gguf, or auto on the CPU). A folder provisioned before
    the file was kept fetches it now; if that fails, auto falls back to the fp32 folder with a warning, while an
    explicit gguf raises ValueError.
    """
    local = Path(config.model).expanduser().exists()
    hub_options = bool(config.model_revision or config.gguf_file)  # the default model's name rejects them
    if (
        local or config.model != DEFAULT_MODEL_NAME or hub_options
    ):  # a local path wins over the default model's name
        path = resolve_model_path(config.model, revision=config.model_revision, gguf_file=config.gguf_file)
        name = path.name if local else config.model
        if path.suffix == ".gguf":
            return ModelSource(name, None, path)
        return ModelSource(name, path, None)
    # the default model comes as a GGUF file: its quantization resolves as a .gguf model's would
    if resolve_quantization(config, device, model_is_gguf=True) != "gguf":
        return ModelSource(DEFAULT_MODEL_NAME, resolve_model_path(DEFAULT_MODEL_NAME), None)
    try:
        folder, gguf = provision_default_gguf(DEFAULT_MODEL_NAME)
    except (RuntimeError, OSError) as exc:
        if config.quantization == "gguf":
            raise ValueError(
                f"quantization 'gguf' needs the GGUF file of {DEFAULT_MODEL_NAME}: {exc}"
            ) from exc
        logger.warning(
            "cannot fetch the GGUF file of %s (%s); loading the fp32 folder instead (quantization none)",
            DEFAULT_MODEL_NAME, exc,
        )  # fmt: skip
        return ModelSource(DEFAULT_MODEL_NAME, resolve_model_path(DEFAULT_MODEL_NAME), None)
    return ModelSource(DEFAULT_MODEL_NAME, folder, gguf)


def load_engine_model(config: EngineConfig, machine: Machine) -> EngineModel:
    """Resolve the model's source, then `config` for this model and `machine` (engine/core/resolve.py), then load
    the model, tokenizer and EOS ids."""
    source = resolve_model_source(config, resolve_device(config.device, machine))
    reader = (
        open_gguf(source.gguf) if source.gguf is not None else None
    )  # parsed once, for config and weights
    hf_config = gguf_hf_config(reader) if reader is not None else load_hf_config(source.folder)
    facts = ModelFacts(
        max_len=int(hf_config.max_position_embeddings),
        linear_weights=ModelArgs.from_hf_config(hf_config).linear_weights,
        is_gguf=reader is not None,
        gguf_blocks=reader is not None and layer_linears_in_blocks(reader),
    )
    resolved = resolve_config(config, machine, facts, native_int8_kernels)
    # the config spells torch's names
    dtype, device = getattr(torch, resolved.dtype), torch.device(resolved.device)
    # the tokenizer is built on a thread while the weights load: its Python (transformers' parse of a 128k vocabulary,
    # ~3 s) overlaps the weights' file reads and dequantization, which release the GIL
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        # a GGUF file's metadata, parsed once above
        tokenizer_job = pool.submit(
            load_tokenizer, source.meta_path, reader if source.folder is None else None
        )
        model, hf_config = _load_weights(source, resolved, dtype, device, reader)
        tokenizer = tokenizer_job.result()
    generation_config = load_generation_config(source.meta_path)
    eos = eos_token_ids(hf_config, generation_config, tokenizer)
    sampling = from_generation_config(generation_config)
    logger.info("sampling defaults of %s: %s", source.name, sampling.given() or "none (built-in)")
    return EngineModel(resolved, dtype, model, hf_config, tokenizer, eos, source.name, source, sampling)


def _load_weights(
    source: ModelSource, resolved: EngineConfig, dtype: torch.dtype, device: torch.device, reader: Any
) -> tuple[LlamaForCausalLM, Any]:
    """The model from the source's GGUF file or folder, and its config."""
    if source.gguf is not None:
        return load_gguf_model(
            source.gguf,
            dtype,
            device,
            quantization=resolved.quantization,
            max_model_len=resolved.max_model_len,
            act_q8=resolved.int8_activations,
            batch_gemm=resolved.batch_gemm,
            weight_layout=resolved.weight_layout,
            reader=reader,
        )
    return load_model(source.folder, dtype, device, max_model_len=resolved.max_model_len)


def load_draft_model(
    asked: EngineConfig, target: EngineConfig, machine: Machine, target_tokenizer: Any
) -> EngineModel:
    """Load `asked.speculative_model` as the target's draft: resolved on its own from what was asked (dtype,
    quantization, KV dtype: auto picks for the draft), with the target's max_model_len, device and block size.
    ValueError when its tokenizer is not the target's (its proposals would be other tokens) or its context is
    shorter than the target's."""
    config = dataclasses.replace(
        asked,
        model=asked.speculative_model,
        model_revision="",
        gguf_file="",
        speculative_method="off",
        speculative_model="",
        device=target.device,
        max_model_len=target.max_model_len,
        kv_disk_bytes=0,
    )
    try:
        loaded = load_engine_model(config, machine)
    except ValueError as exc:
        raise ValueError(f"the draft model {asked.speculative_model!r}: {exc}") from exc
    if loaded.tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(
            f"the draft model {asked.speculative_model!r} does not share the target's tokenizer: speculative "
            "decoding needs both to read and write the same token ids"
        )
    logger.info("draft model %s: %s", loaded.model_name, loaded.config)
    return loaded
