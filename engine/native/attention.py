"""The compiled CPU decode-attention kernel (attention.c): built once per machine, called through ctypes.

Torch has no op that attends through a block table, so the pure-torch decode path copies every sequence's blocks
into a padded tensor per layer and reads them again in SDPA: three passes over the KV bytes, the largest cost of a
CPU decode step. The kernel reads each block once, in place. It is built by engine.native.build (a C compiler is
needed once); without one, or with PAGEDCHAT_NATIVE=0, `load_kernel()` returns None and the torch path is used.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from engine.native.build import DISABLE_ENV, load_library

__all__ = ["DISABLE_ENV", "NativeDecode", "kv_format", "load_kernel"]

SOURCE = Path(__file__).with_name("attention.c")
SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
KV_SAME, KV_INT8, KV_F16 = 0, 1, 2  # attention.c's kv_format


def kv_format(cache_dtype: torch.dtype, q_dtype: torch.dtype) -> int | None:
    """attention.c's kv_format for caches of `cache_dtype` read by queries of `q_dtype`; None: not a pair it runs."""
    if cache_dtype == torch.int8 and q_dtype in SUPPORTED_DTYPES:
        return KV_INT8
    if cache_dtype == torch.float16 and q_dtype == torch.float32:
        return KV_F16
    return KV_SAME if cache_dtype == q_dtype and q_dtype in SUPPORTED_DTYPES else None


_lock = threading.Lock()
_kernels: dict[int, NativeDecode] = {}


class NativeDecode:
    """`paged_decode` of the compiled library: decode attention straight from the paged cache.

    Caches hold q's dtype, or int8 with fp16 scales [num_blocks, block_size, Hkv] (unit stride over heads) beside
    them, quantized by `store_kv` exactly as kernels/reference.py's quantize_kv_ref does, or fp16 under fp32 queries
    (rounded to nearest even by `store_kv`, as torch's .to(float16)).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self._fn = lib.paged_decode
        self._fn.restype = i32
        self._fn.argtypes = [i32, i32, ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, ptr, i64, i64]
        self._fn.argtypes += [ptr, ptr, ptr, i64, ptr, i64, i64] + [i32] * 5 + [ctypes.c_float, i32]
        self._store = lib.store_kv
        self._store.restype = None
        self._store.argtypes = [i32, ptr, ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, i32, i32, i32, i32]
        self._store_int8 = lib.store_kv_int8
        self._store_int8.restype = None
        self._store_int8.argtypes = [
            i32,
            ptr,
            ptr,
            i64,
            i64,
            ptr,
            ptr,
            i64,
            i64,
            i64,
            ptr,
            ptr,
            i64,
            i64,
            ptr,
        ]
        self._store_int8.argtypes += [i32] * 4
        self._store_f16 = lib.store_kv_f16
        self._store_f16.restype = None
        self._store_f16.argtypes = [ptr, ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, i32, i32, i32, i32]

    @staticmethod
    def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether these inputs fit the kernel: CPU, bf16/fp32 (caches alike, or int8; fp16 under fp32), head_dim a
        multiple of 16 up to 256, GQA <= 16."""
        num_heads, head_dim = q.shape[1:]
        num_kv_heads = k_cache.shape[2]
        return (
            q.device.type == "cpu"
            and kv_format(k_cache.dtype, q.dtype) is not None
            and head_dim % 16 == 0
            and 16 <= head_dim <= 256
            and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads <= 16
        )

    @staticmethod
    def can_store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        """Whether store_kv applies: CPU tensors with unit stride over head_dim, k/v alike, caches alike, the caches
        of k's dtype, int8 (then k is bf16/fp32) or fp16 (then k is fp32)."""
        tensors = (k, v, k_cache, v_cache)
        if k_cache.dtype == torch.int8:
            dtypes_ok = k.dtype in SUPPORTED_DTYPES and v.dtype == k.dtype and v_cache.dtype == torch.int8
        elif k_cache.dtype == torch.float16 and k.dtype == torch.float32:
            dtypes_ok = v.dtype == torch.float32 and v_cache.dtype == torch.float16
        else:
            dtypes_ok = all(t.dtype == k.dtype for t in tensors)
        return (
            dtypes_ok
            and all(t.device.type == "cpu" and t.stride(-1) == 1 for t in tensors)
            and k.stride() == v.stride()
            and k_cache.stride() == v_cache.stride()
        )

    def store_kv(
        self,
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [T] int64; negative = padding, skipped
        k_scale: torch.Tensor | None = None,  # int8 caches: [num_blocks, block_size, Hkv] fp16
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """Copy (or, into int8 caches, quantize; into fp16 caches under fp32 rows, round) each token's K/V rows into
        the caches at its slot."""
        assert self.can_store(k, v, k_cache, v_cache), "inputs store_kv does not support (check can_store())"
        assert slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
        assert k.shape[0] == slot_mapping.shape[0] and k.shape[1:] == v.shape[1:] == k_cache.shape[2:]
        num_tokens, num_kv_heads, head_dim = k.shape
        common = (
            k.data_ptr(),
            v.data_ptr(),
            k.stride(0),
            k.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
        )
        if k_cache.dtype != k.dtype and k_cache.dtype == torch.float16:
            self._store_f16(
                *common, slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_dim, k_cache.shape[1]
            )
            return
        if k_cache.dtype != torch.int8:
            self._store(
                k.element_size(), *common, slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_dim,
                k_cache.shape[1],
            )  # fmt: skip
            return
        s_block, s_tok = _check_scales(k_cache, k_scale, v_scale)
        self._store_int8(
            int(k.dtype == torch.bfloat16), *common, k_scale.data_ptr(), v_scale.data_ptr(), s_block, s_tok,
            slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_dim, k_cache.shape[1],
        )  # fmt: skip

    def __call__(
        self,
        q: torch.Tensor,  # [T, Hq, D], unit stride over D
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], unit stride over D
        v_cache: torch.Tensor,  # same shape and strides as k_cache
        rows: torch.Tensor,  # [n] int32: the query row (and output row) of each decoding sequence
        seq_lens: torch.Tensor,  # [n] int32: its context length, this token included
        block_tables: torch.Tensor,  # [n, max_blocks] int32
        out: torch.Tensor,  # [T, Hq, D], same dtype as q; rows not in `rows` are left untouched
        scale: float,
        k_scale: torch.Tensor | None = None,  # int8 caches: [num_blocks, block_size, Hkv] fp16
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """Attend each row's query over its sequence's cached context, writing the result into `out`."""
        assert self.supports(q, k_cache), "inputs the kernel does not support (check supports() first)"
        assert q.stride(-1) == out.stride(-1) == k_cache.stride(-1) == 1, "head_dim must have unit stride"
        assert k_cache.stride() == v_cache.stride() and out.dtype == q.dtype
        assert v_cache.dtype == k_cache.dtype
        for t in (rows, seq_lens, block_tables):
            assert t.dtype == torch.int32 and t.is_contiguous(), "index tensors must be contiguous int32"
        num_seqs = rows.shape[0]
        assert seq_lens.shape[0] == num_seqs == block_tables.shape[0]
        kv_int8 = k_cache.dtype == torch.int8
        s_block, s_tok = _check_scales(k_cache, k_scale, v_scale) if kv_int8 else (0, 0)
        status = self._fn(
            int(q.dtype == torch.bfloat16),
            kv_format(k_cache.dtype, q.dtype),
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            k_scale.data_ptr() if kv_int8 else None,
            v_scale.data_ptr() if kv_int8 else None,
            s_block,
            s_tok,
            rows.data_ptr(),
            seq_lens.data_ptr(),
            block_tables.data_ptr(),
            block_tables.stride(0),
            out.data_ptr(),
            out.stride(0),
            out.stride(1),
            num_seqs,
            q.shape[1],
            k_cache.shape[2],
            q.shape[2],
            k_cache.shape[1],
            scale,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"paged_decode rejected its inputs (status {status})")


def _check_scales(
    k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> tuple[int, int]:
    """The (block, token) strides of an int8 cache's scale tensors, after checking them against the cache."""
    assert k_scale is not None and v_scale is not None, "int8 caches need their k_scale and v_scale"
    for s in (k_scale, v_scale):
        assert s.dtype == torch.float16 and s.device.type == "cpu", "scales must be fp16 CPU tensors"
        assert s.shape == k_cache.shape[:3] and s.stride(-1) == 1, (
            "scales must be [num_blocks, block_size, Hkv]"
        )
    assert k_scale.stride() == v_scale.stride()
    return k_scale.stride(0), k_scale.stride(1)


def load_kernel(march: str = "native") -> NativeDecode | None:
    """The kernel for this machine, compiling it on first use; None when disabled or it cannot be built. `march`:
    tests build "x86-64-v3" too, to run AVX2 machines' kernel on an AVX-512 CPU (build.load_library)."""
    lib = load_library(SOURCE, march)
    if lib is None:
        return None
    with _lock:
        if id(lib) not in _kernels:
            _kernels[id(lib)] = NativeDecode(lib)
        return _kernels[id(lib)]
