"""The hardware facts that `auto` reads (engine/core/resolve.py decides), and torch's spelling of its answers."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from engine.core import resolve
from engine.core.resolve import Machine

_NAMED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPU_VNNI_FLAGS = frozenset({"avx512_vnni", "avx512bw"})  # all of them: the int8 dot weight_layout rows8 wants


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags listed in the text of /proc/cpuinfo."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


@cache
def this_cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (Linux; empty where /proc/cpuinfo is absent)."""
    try:
        return cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def cpu_has_fast_bf16() -> bool:
    """True when the CPU advertises AVX512-BF16 or AMX-BF16."""
    return bool(this_cpu_flags() & CPU_BF16_FLAGS)


def cpu_has_avx512_vnni() -> bool:
    """True when the CPU advertises AVX512-VNNI and AVX512-BW."""
    return this_cpu_flags() >= CPU_VNNI_FLAGS


def probe_machine(device: str = "auto") -> Machine:
    """This machine's answers to what `auto` asks (engine/core/resolve.py decides) for config.device `device`."""
    cuda = torch.cuda.is_available()
    # asking starts CUDA: not for a run on the CPU
    cuda_bf16 = cuda and device != "cpu" and torch.cuda.is_bf16_supported()
    return Machine(
        cuda=cuda,
        cuda_bf16=cuda_bf16,
        cpu_fast_bf16=cpu_has_fast_bf16(),
        cpu_avx512_vnni=cpu_has_avx512_vnni(),
    )


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU raises ValueError."""
    return torch.device(resolve.resolve_device(name, probe_machine(name)))


def resolve_dtype(name: str, device: torch.device, *, gguf_blocks: bool = False) -> torch.dtype:
    """`auto` -> bf16 on a bf16-capable GPU or CPU, else fp32 (fp32 beside GGUF blocks); see resolve.resolve_dtype."""
    machine = probe_machine(device.type)
    return _NAMED_DTYPES[resolve.resolve_dtype(name, device.type, machine, gguf_blocks=gguf_blocks)]


def dtype_name(dtype: torch.dtype) -> str:
    """The config spelling of a torch dtype (inverse of the named mapping)."""
    for name, value in _NAMED_DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}")
