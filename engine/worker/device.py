"""Device and dtype resolution: `auto` picks CUDA when present and bf16 where the hardware computes it fast."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

_NAMED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags listed in the text of /proc/cpuinfo."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


@cache
def cpu_has_fast_bf16() -> bool:
    """True when the CPU advertises AVX512-BF16 or AMX-BF16 (Linux; False where /proc/cpuinfo is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(cpu_flags(text) & CPU_BF16_FLAGS)


# the largest bf16 copy of a model's linears that batch_gemm auto makes (SmolLM2-135M's is 0.27 GB); a bigger model
# multiplies its batches in the blocks themselves (int8), so its memory stays the file's: at 1B a bf16 copy is ~3x the
# Q4_K_M file (measured: 8.65 GB RSS beside llama.cpp's 6.46 at equal KV, 4.4 GB of it KV)
BF16_COPY_MAX_BYTES = 512 << 20


def resolve_batch_gemm(name: str, device: torch.device, linear_weights: int | None = None) -> str:
    """`auto` -> bf16 on a CPU that computes bf16 fast when the copy of the model's `linear_weights` it makes is small
    (<= BF16_COPY_MAX_BYTES; unknown counts as small), int8 on another CPU or for a bigger model, fp32 on a GPU
    (where the setting has no use: the blocks are multiplied on the CPU only); see EngineConfig.batch_gemm."""
    if name not in ("auto", "fp32", "bf16", "int8"):
        raise ValueError(f"batch_gemm must be 'auto', 'fp32', 'bf16' or 'int8', got {name!r}")
    if name != "auto":
        return name
    if device.type != "cpu":
        return "fp32"
    small = linear_weights is None or 2 * linear_weights <= BF16_COPY_MAX_BYTES
    return "bf16" if cpu_has_fast_bf16() and small else "int8"


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU raises ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, *, gguf_blocks: bool = False) -> torch.dtype:
    """`auto` -> bf16 on a bf16-capable GPU or CPU, else fp32; named dtypes map directly.

    `gguf_blocks`: the linears keep a GGUF file's blocks (quantization gguf). Their kernels multiply in fp32, so
    `auto` is fp32 then: bf16 activations would add conversions around every kernel, round the logits, and turn
    the fused decode step off (it takes fp32), while the weights' bytes stay the blocks' either way.
    """
    if name in _NAMED_DTYPES:
        return _NAMED_DTYPES[name]
    if name != "auto":
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_NAMED_DTYPES)}, got {name!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if gguf_blocks:
        return torch.float32
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """The config spelling of a torch dtype (inverse of the named mapping)."""
    for name, value in _NAMED_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}")
