"""Launch helpers shared by the kernels: where a kernel can run, and the input checks of the launchers.

Triton reads `TRITON_INTERPRET=1` when `@triton.jit` decorates a function, including the helpers of
`triton.language` itself (`tl.zeros`, `tl.max`, ...) decorated when triton is first imported. So the mode is
fixed per process by whoever imports triton first: kernels then either run compiled on CUDA tensors, or
interpreted (numpy, one program after another) on CPU tensors. Mixing the modes in one process does not work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (*FLOAT_DTYPES, torch.int8)  # int8 caches carry an fp16 scale per (token, kv head) beside them


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes and launch options of an attention kernel; None leaves the choice to the launcher."""

    tile_n: int | None = None  # context tokens per inner-loop step (any power of two >= 16; may span pages)
    block_m: int | None = (
        None  # prefill only: query rows (tokens x grouped heads) per program, power of two >= 16
    )
    num_warps: int | None = None
    num_stages: int | None = None  # software-pipelining depth; None: Triton's default

    def launch_options(self) -> dict[str, int]:
        """num_warps / num_stages keyword arguments for the kernel launch (unset ones omitted)."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        return {key: value for key, value in options.items() if value is not None}


def check_power_of_two(name: str, value: int, minimum: int) -> None:
    """Raise RuntimeError unless value is a power of two >= minimum (tl.arange and tl.dot need both)."""
    if value < minimum or value & (value - 1):
        raise RuntimeError(f"{name} must be a power of two >= {minimum}, got {value}")


def _fix_interpreter_scalar_index() -> None:
    """Make `range(start, tensor_end, step)` work in Triton 3.6's interpreter under numpy >= 2.4.

    The interpreter turns a scalar tensor (a 1-element array) into a loop bound with int(array), which numpy
    2.4 refuses for arrays with ndim > 0 (triton-lang/triton#9171, fixed after 3.6). Compiled kernels are not
    affected; remove this once triton is upgraded.
    """
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "scalar_index_fixed", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.scalar_index_fixed = True
    interpreter._patch_lang_tensor = patch_lang_tensor


_fix_interpreter_scalar_index()


def is_interpreted(kernel: JITFunction | InterpretedFunction) -> bool:
    """Whether this process runs `kernel` in Triton's interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return isinstance(kernel, InterpretedFunction)


def check_launchable(kernel: object, device: torch.device) -> None:
    """Raise RuntimeError unless `kernel` can run on tensors on `device` in this process."""
    if device.type == "cpu" and isinstance(kernel, JITFunction):
        raise RuntimeError(
            "Triton kernels run on CPU tensors only in the interpreter: set TRITON_INTERPRET=1 before triton is "
            "first imported"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"Triton kernels run on cuda (or cpu, interpreted) tensors, got device {device}")


def check_tensor(
    name: str, tensor: torch.Tensor, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device
) -> None:
    """Raise RuntimeError unless `tensor` has `ndim` dims, one of `dtypes` and lives on `device`."""
    if tensor.dim() != ndim:
        raise RuntimeError(f"{name} must have {ndim} dims, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise RuntimeError(f"{name} must have dtype in {dtypes}, got {tensor.dtype}")
    if tensor.device != device:
        raise RuntimeError(f"{name} must be on {device}, got {tensor.device}")


def check_kv_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> bool:
    """Raise RuntimeError unless K and V caches are matching [blocks, block_size, kv_heads, head_dim] tensors.

    int8 caches need k_scale and v_scale, matching fp16 [blocks, block_size, kv_heads] tensors; float caches take
    none. Returns whether the caches are int8 (the kernels' QUANTIZED flag).
    """
    check_tensor("k_cache", k_cache, 4, CACHE_DTYPES, k_cache.device)
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype or v_cache.device != k_cache.device:
        raise RuntimeError(
            f"v_cache {tuple(v_cache.shape)} {v_cache.dtype} {v_cache.device} must match "
            f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} {k_cache.device}"
        )
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise RuntimeError(
            f"k_cache and v_cache must share strides and be contiguous in head_dim, got {k_cache.stride()} "
            f"and {v_cache.stride()}"
        )
    quantized = k_cache.dtype == torch.int8
    if not quantized:
        if k_scale is not None or v_scale is not None:
            raise RuntimeError(f"k_scale and v_scale are only for int8 caches, got {k_cache.dtype} caches")
        return False
    if k_scale is None or v_scale is None:
        raise RuntimeError(
            "int8 caches need k_scale and v_scale (fp16 [num_blocks, block_size, num_kv_heads])"
        )
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        check_tensor(name, scale, 3, (torch.float16,), k_cache.device)
        if scale.shape != k_cache.shape[:3]:
            raise RuntimeError(
                f"{name} must be [num_blocks, block_size, num_kv_heads] = {tuple(k_cache.shape[:3])}, "
                f"got {tuple(scale.shape)}"
            )
    if k_scale.stride() != v_scale.stride():
        raise RuntimeError(
            f"k_scale and v_scale must share strides, got {k_scale.stride()} and {v_scale.stride()}"
        )
    return True


def scale_args(
    k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
    """The kernels' scale arguments: both scale tensors and their strides (the cache and zeros when float)."""
    if k_scale is None or v_scale is None:
        return k_cache, k_cache, 0, 0, 0  # unused: QUANTIZED is False, so the kernel never reads them
    return k_scale, v_scale, k_scale.stride(0), k_scale.stride(1), k_scale.stride(2)


def check_attention_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_seqs: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> bool:
    """Raise RuntimeError unless q [tokens, heads, head_dim] and the per-sequence tensors fit the caches.

    q has the caches' dtype, or any float dtype over int8 caches. Returns whether the caches are int8.
    """
    quantized = check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    device = k_cache.device
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    check_tensor("q", q, 3, FLOAT_DTYPES if quantized else (k_cache.dtype,), device)
    if q.shape[2] != head_dim or q.shape[1] % num_kv_heads != 0 or q.stride(-1) != 1:
        raise RuntimeError(
            f"q must be [num_tokens, num_heads, {head_dim}] with num_heads a multiple of {num_kv_heads} and "
            f"contiguous in head_dim, got shape {tuple(q.shape)} strides {q.stride()}"
        )
    check_tensor("block_tables", block_tables, 2, (torch.int32,), device)
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,), device)
    if block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs or block_tables.stride(-1) != 1:
        raise RuntimeError(
            f"block_tables {tuple(block_tables.shape)} and seq_lens {tuple(seq_lens.shape)} must have "
            f"{num_seqs} rows (block_tables contiguous in its last dim)"
        )
    return quantized
