"""Compile every kernel launch for a CUDA architecture on a machine without a GPU, and report register spills.

The interpreter checks what a kernel computes, not whether it compiles: a loop-carried type change or an
unsupported op only shows up in the compiler. This runs each launcher on small CPU tensors with production-like
strides, records the launch instead of running it, then builds the same specialised signature the JIT would
(dtypes, 16-divisible ints and pointers, ints equal to 1) and compiles it with Triton's bundled ptxas.
Run it in a process without TRITON_INTERPRET: `python -m kernels.compile_check [--arch 90]`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from kernels import paged_decode, paged_prefill, store_kv


@dataclass(frozen=True)
class CompileReport:
    """One compiled launch: which scenario and kernel, its registers, spill bytes and shared memory."""

    scenario: str
    kernel: str
    num_warps: int
    registers: int
    spill_bytes: int  # the STACK size ptxas reports: nonzero means registers spilled to local memory
    shared_bytes: int


class _Recorder:
    """Stands in for a kernel: `kernel[grid](*args, **kwargs)` records the call instead of launching."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid: tuple) -> Callable[..., None]:
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


@contextlib.contextmanager
def _recording(module: ModuleType) -> Iterator[dict[str, _Recorder]]:
    """Replace every @triton.jit kernel of `module` by a recorder for the duration of the block."""
    kernels = {name: value for name, value in vars(module).items() if isinstance(value, JITFunction)}
    if not kernels:
        raise RuntimeError(f"{module.__name__} has no compiled kernels: run without TRITON_INTERPRET=1")
    recorders = {name: _Recorder() for name in kernels}
    for name, recorder in recorders.items():
        setattr(module, name, recorder)
    try:
        yield recorders
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)


def compile_launch(
    kernel: JITFunction, args: tuple, kwargs: dict, arch: int
) -> triton.compiler.CompiledKernel:
    """Compile `kernel(*args, **kwargs)` for sm_`arch` with the JIT's specialisation of these arguments."""
    kwargs = dict(kwargs)
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
    bound = kernel.signature.bind(*args, **kwargs).arguments
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[(i,)] = "constexpr", value
            continue
        type_name, attr = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[param.name] = type_name
        if type_name == "constexpr":
            constexprs[(i,)] = value
        elif isinstance(attr, str):
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    source = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {text!r}")
    return int(match.group(1)), int(match.group(2))


def _scenarios(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype):
    """(name, module, run) for each launcher call of one model shape; run calls the launcher."""
    num_blocks, num_seqs, max_blocks = 64, 4, 32
    cache = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    k_cache, v_cache = cache[0], cache[1]
    block_tables = torch.zeros(num_seqs, max_blocks, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), 100, dtype=torch.int32)
    q = torch.zeros(num_seqs * 8, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype)[
        :, :num_heads
    ]  # a qkv slice
    kv = torch.zeros(num_seqs * 8, num_kv_heads, head_dim, dtype=dtype)
    slots = torch.arange(num_seqs * 8, dtype=torch.int64)
    query_start_loc = torch.arange(0, num_seqs * 8 + 1, 8, dtype=torch.int32)
    # int8 caches with their fp16 scales, [2, num_blocks, block_size, num_kv_heads] like the cache pool
    q8 = torch.zeros(2, num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.int8)
    scales = torch.zeros(2, num_blocks, block_size, num_kv_heads, dtype=torch.float16)
    int8 = {"k_scale": scales[0], "v_scale": scales[1]}
    decode, prefill = paged_decode.paged_decode_attention, paged_prefill.paged_prefill_attention
    return [
        ("store_kv", store_kv, lambda: store_kv.store_kv(kv, kv, k_cache, v_cache, slots)),
        ("decode", paged_decode, lambda: decode(q[:num_seqs], k_cache, v_cache, block_tables, seq_lens, 0.1, num_splits=1)),
        ("decode split-K", paged_decode, lambda: decode(q[:num_seqs], k_cache, v_cache, block_tables, seq_lens, 0.1, num_splits=8)),
        ("prefill", paged_prefill, lambda: prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, 0.1, 512)),
        ("prefill, decodes", paged_prefill, lambda: prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, 0.1, 1)),
        ("store_kv int8", store_kv, lambda: store_kv.store_kv(kv, kv, q8[0], q8[1], slots, **int8)),
        ("decode int8", paged_decode, lambda: decode(q[:num_seqs], q8[0], q8[1], block_tables, seq_lens, 0.1, num_splits=1, **int8)),
        ("decode split-K int8", paged_decode, lambda: decode(q[:num_seqs], q8[0], q8[1], block_tables, seq_lens, 0.1, num_splits=8, **int8)),
        ("prefill int8", paged_prefill, lambda: prefill(q, q8[0], q8[1], block_tables, query_start_loc, seq_lens, 0.1, 512, **int8)),
    ]  # fmt: skip


def compile_all(
    shapes: tuple[tuple[int, int, int, int], ...] = ((32, 8, 128, 16), (9, 3, 64, 16)),
    dtype: torch.dtype = torch.bfloat16,
    arch: int = 90,
) -> list[CompileReport]:
    """Compile every launch for each (num_heads, num_kv_heads, head_dim, block_size) shape."""
    reports = []
    for shape in shapes:
        for name, module, run in _scenarios(*shape, dtype):
            with _recording(module) as recorders:
                run()
            for kernel_name, recorder in recorders.items():
                for args, kwargs in recorder.calls:
                    compiled = compile_launch(getattr(module, kernel_name), args, kwargs, arch)
                    registers, spill_bytes = _resource_usage(compiled.asm["cubin"])
                    reports.append(
                        CompileReport(
                            f"{name} H{shape[0]}/{shape[1]} D{shape[2]} bs{shape[3]}", kernel_name,
                            compiled.metadata.num_warps, registers, spill_bytes, compiled.metadata.shared,
                        )
                    )  # fmt: skip
    return reports


def main() -> None:
    """Print one line per compiled launch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", type=int, default=90, help="CUDA compute capability as an integer (90 = H100/H200)"
    )
    parser.add_argument("--json", action="store_true", help="print the reports as one JSON list")
    args = parser.parse_args()
    reports = compile_all(arch=args.arch)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports]))
        return
    for r in reports:
        print(
            f"{r.scenario:40s} {r.kernel:24s} warps={r.num_warps} regs={r.registers:3d} "
            f"spill={r.spill_bytes:4d}B shared={r.shared_bytes}B"
        )


if __name__ == "__main__":
    main()
