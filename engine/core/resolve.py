"""`auto` resolved once: the user's EngineConfig, the machine and the model file's facts -> the config the engine runs.

Every `auto` (and unset) knob is decided here and nowhere else; engine/worker/device.py only probes the hardware
(`Machine`) and engine/loading/engine_model.py only reads the model file (`ModelFacts`) before the weights load. The
result is an EngineConfig again (frozen, the same fields the app and the benches read) with device, dtype,
quantization, int8_activations, batch_gemm, attention_backend, max_model_len and max_num_batched_tokens concrete.
kv_cache_dtype stays a config choice (`auto` and `model` mean the model's dtype; KVCacheSpec names it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.config import DEFAULT_MODEL, EngineConfig

DTYPES = ("float32", "bfloat16", "float16")
BATCH_GEMMS = ("fp32", "bf16", "int8")
# the largest bf16 copy of a model's linears that batch_gemm auto makes (SmolLM2-135M's is 0.27 GB); a bigger model
# multiplies its batches in the blocks themselves (int8), so its memory stays the file's: at 1B a bf16 copy is ~3x the
# Q4_K_M file (measured: 8.65 GB RSS beside llama.cpp's 6.46 at equal KV, 4.4 GB of it KV)
BF16_COPY_MAX_BYTES = 512 << 20


@dataclass(frozen=True)
class Machine:
    """What `auto` needs to know of the hardware (engine/worker/device.py probes it)."""

    cuda: bool  # torch sees a CUDA device
    cuda_bf16: bool  # ... that computes bf16
    cpu_fast_bf16: bool  # the CPU advertises AVX512-BF16 or AMX-BF16
    cpu_avx512_vnni: bool = (
        False  # ... AVX512-VNNI and AVX512-BW: the 64-byte int8 dot of weight_layout rows8
    )


@dataclass(frozen=True)
class ModelFacts:
    """What `auto` needs to know of the model, read from its config or GGUF file before the weights load."""

    max_len: int  # the model's own limit (max_position_embeddings)
    linear_weights: int  # weights in its matmuls: the size of the bf16 copy batch_gemm bf16 makes
    is_gguf: bool  # the weights come from a GGUF file
    gguf_blocks: bool  # ... and every layer linear of it is in a block format (see layer_linears_in_blocks)


def resolve_config(
    config: EngineConfig, machine: Machine, model: ModelFacts, native_int8: Callable[[], bool]
) -> EngineConfig:
    """A copy of `config` with `auto` and `None` replaced by concrete values for this model and machine; ValueError
    for a combination that cannot run.

    `native_int8()`: whether the compiled kernels that round activations to int8 and the CPU attention kernel are
    built here; asked only where the blocks are multiplied as they are with int8 activations.
    """
    device = resolve_device(config.device, machine)
    batch_gemm = resolve_batch_gemm(config.batch_gemm, device, machine, model.linear_weights)
    quantization = resolve_quantization(config, device, model.is_gguf)
    in_blocks = quantization == "gguf" and model.gguf_blocks
    # auto: fp32 beside GGUF blocks (their kernels take fp32), else bf16 where the hardware computes it fast
    dtype = resolve_dtype(config.dtype, device, machine, gguf_blocks=in_blocks)
    # unset: the model's own limit (the engine shortens it to what the KV pool holds, engine/core/memory.py)
    max_model_len = config.max_model_len
    if max_model_len is None:
        max_model_len = model.max_len
    elif max_model_len > model.max_len:
        raise ValueError(f"max_model_len ({max_model_len}) exceeds the model's limit ({model.max_len})")
    batched = config.max_num_batched_tokens
    if batched is None:
        batched = 512 if device == "cpu" else 8192
    backend = config.attention_backend
    if backend == "auto":
        backend = "triton" if device == "cuda" else "torch"
    int8_activations = config.int8_activations
    if int8_activations is None:
        int8_activations = quantization == "gguf"
    kv_cache_dtype = config.kv_cache_dtype
    # native_int8 last: without the kernels the activations are not rounded (the mode is exact), and asking builds them
    rounded = int8_activations and in_blocks and native_int8()
    if kv_cache_dtype == "auto" and backend == "torch" and dtype == "float32" and rounded:
        # the fast mode is inexact already; an fp16 pool halves what attention reads and adds less than int8
        # activations do (`pagedchat bench quality`, modes gguf-int8 and gguf-int8-fp16kv); exact modes stay exact
        kv_cache_dtype = "float16"
    check_kv_cache_dtype(kv_cache_dtype, dtype, backend)
    weight_layout = resolve_weight_layout(
        config.weight_layout, in_blocks, rounded and machine.cpu_avx512_vnni
    )
    return dataclasses.replace(
        config,
        device=device,
        dtype=dtype,
        quantization=quantization,
        int8_activations=int8_activations,
        batch_gemm=batch_gemm,
        weight_layout=weight_layout,
        kv_cache_dtype=kv_cache_dtype,
        attention_backend=backend,
        max_model_len=max_model_len,
        max_num_batched_tokens=batched,
    )


def resolve_device(name: str, machine: Machine) -> str:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU raises ValueError."""
    if name == "auto":
        return "cuda" if machine.cuda else "cpu"
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    if name == "cuda" and not machine.cuda:
        raise ValueError("device 'cuda' was requested but torch sees no CUDA device")
    return name


def resolve_dtype(name: str, device: str, machine: Machine, *, gguf_blocks: bool = False) -> str:
    """`auto` -> bf16 on a bf16-capable GPU or CPU, else fp32; named dtypes stay.

    `gguf_blocks`: the linears keep a GGUF file's blocks (quantization gguf). Their kernels multiply in fp32, so
    `auto` is fp32 then: bf16 activations would add conversions around every kernel, round the logits, and turn
    the fused decode step off (it takes fp32), while the weights' bytes stay the blocks' either way.
    """
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {name!r}")
    if device == "cuda":
        return "bfloat16" if machine.cuda_bf16 else "float32"
    if gguf_blocks:
        return "float32"
    return "bfloat16" if machine.cpu_fast_bf16 else "float32"


def resolve_batch_gemm(name: str, device: str, machine: Machine, linear_weights: int | None = None) -> str:
    """`auto` -> bf16 on a CPU that computes bf16 fast when the copy of the model's `linear_weights` it makes is small
    (<= BF16_COPY_MAX_BYTES; unknown counts as small), int8 on another CPU or for a bigger model, fp32 on a GPU
    (where the setting has no use: the blocks are multiplied on the CPU only); see EngineConfig.batch_gemm."""
    if name != "auto" and name not in BATCH_GEMMS:
        raise ValueError(f"batch_gemm must be 'auto', 'fp32', 'bf16' or 'int8', got {name!r}")
    if name != "auto":
        return name
    if device != "cpu":
        return "fp32"
    small = linear_weights is None or 2 * linear_weights <= BF16_COPY_MAX_BYTES
    return "bf16" if machine.cpu_fast_bf16 and small else "int8"


def resolve_weight_layout(name: str, in_blocks: bool, rounded: bool) -> str:
    """`auto` -> rows8 where the linears keep blocks and multiply them with int8 activations on the compiled kernels
    of an AVX512-VNNI CPU (`rounded`: the caller asks both), else file; rows8 without blocks to repack raises
    ValueError. See EngineConfig.weight_layout: with AVX2 alone the layout was no faster (a Zen 4 running the AVX2
    build: 1 row 8% slower, 5 rows 6% faster than Q4_K's own kernel)."""
    if name not in ("auto", "file", "rows8"):
        raise ValueError(f"weight_layout must be 'auto', 'file' or 'rows8', got {name!r}")
    if name == "rows8" and not in_blocks:
        raise ValueError(
            "weight_layout 'rows8' repacks a GGUF model's blocks: it needs quantization 'gguf' on the CPU and every "
            "layer linear of the file in a block format"
        )
    if name == "auto":
        return "rows8" if in_blocks and rounded else "file"
    return name


def resolve_quantization(config: EngineConfig, device: str, model_is_gguf: bool) -> str:
    """`auto` -> gguf for GGUF weights on the CPU, else none; an impossible explicit choice raises ValueError."""
    quantization = config.quantization
    if quantization == "auto":
        quantization = "gguf" if model_is_gguf and device == "cpu" else "none"
    elif quantization == "gguf" and device != "cpu":
        raise ValueError(
            f"quantization 'gguf' runs on the CPU only, not on {device}: use quantization 'none' or 'auto'"
        )
    elif quantization == "gguf" and not model_is_gguf:
        raise ValueError(
            f"quantization 'gguf' needs a GGUF model (a .gguf file or {DEFAULT_MODEL!r}), got {config.model!r}"
        )
    if config.int8_activations and quantization != "gguf":
        raise ValueError(
            f"int8_activations needs quantization 'gguf', but quantization resolves to {quantization!r} "
            f"(model {config.model!r} on {device})"
        )
    return quantization


def check_kv_cache_dtype(kv_cache_dtype: str, dtype: str, attention_backend: str) -> None:
    """ValueError when the pool's dtype cannot serve the activations' `dtype` on the attention backend."""
    if kv_cache_dtype != "float16" or dtype == "float16":
        return
    if dtype != "float32":
        raise ValueError(
            f"kv_cache_dtype float16 is for float32 activations (it halves their bytes); under {dtype} "
            "activations it saves nothing and the CPU kernels do not read it: use kv_cache_dtype auto or int8"
        )
    if attention_backend == "triton":
        raise ValueError(
            "kv_cache_dtype float16 under float32 activations is read by the CPU attention kernels and the "
            "torch backend only; the Triton kernels take a pool of the model's dtype or int8: use "
            "kv_cache_dtype auto or int8, or attention_backend torch"
        )
