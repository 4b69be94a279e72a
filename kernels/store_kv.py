"""Scatter one step's new keys and values into the paged KV cache, quantizing them for int8 caches.

Token t's K/V go to slot `slot_mapping[t]`, i.e. block `slot // block_size`, row `slot % block_size` of the cache
`[num_blocks, block_size, num_kv_heads, head_dim]`. A negative slot marks a padding token and is skipped.
One program copies one token: all of its KV heads at once, as one [heads, head_dim] tile.

int8 caches (QUANTIZE) store each (token, kv head) row as int8 values and one fp16 scale, written at the same slot
of `[num_blocks, block_size, num_kv_heads]` scale tensors, with exactly the fp32 operations of
`kernels.reference.quantize_kv_ref`, so the cache matches the twin bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.runtime import FLOAT_DTYPES, check_kv_cache, check_launchable, check_tensor, scale_args

FP16_MAX: tl.constexpr = tl.constexpr(65504.0)


@triton.jit
def quantize_rows(x):
    """Symmetric int8 rows of x [ROWS, BLOCK_D] (padding lanes 0) and their fp16 scales [ROWS], as quantize_kv_ref.

    Both divisions are IEEE-rounded (div_rn): a plain `/` compiles to an approximate fp32 division on CUDA, which
    could move a value across a rounding boundary and break the bit-for-bit match with the twin.
    """
    x = x.to(tl.float32)
    scale = tl.minimum(tl.math.div_rn(tl.max(tl.abs(x), 1), 127.0), FP16_MAX).to(tl.float16)
    s = scale.to(tl.float32)[:, None]
    q = tl.floor(tl.math.div_rn(x, tl.where(s > 0, s, 1.0)) + 0.5)
    q = tl.where(s > 0, tl.minimum(tl.maximum(q, -127.0), 127.0), 0.0)
    return q.to(tl.int8), scale


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] k's dtype, or int8 when QUANTIZE
    v_cache_ptr,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp16, written when QUANTIZE
    v_scale_ptr,
    slot_mapping_ptr,  # [num_tokens] int64
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_c_b,  # k_cache and v_cache share strides (checked by the launcher)
    stride_c_s,
    stride_c_h,
    stride_s_b,  # so do k_scale and v_scale
    stride_s_s,
    stride_s_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,  # NUM_KV_HEADS rounded up to a power of two
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    QUANTIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block_id = slot // BLOCK_SIZE
    block_offset = slot % BLOCK_SIZE

    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)

    k = tl.load(k_ptr + token * stride_k_t + h[:, None] * stride_k_h + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_t + h[:, None] * stride_v_h + d[None, :], mask=mask)
    cache_offsets = block_id * stride_c_b + block_offset * stride_c_s + h[:, None] * stride_c_h + d[None, :]
    if QUANTIZE:
        k, k_scale = quantize_rows(tl.where(mask, k, 0.0))  # padding lanes must not count in the row's max
        v, v_scale = quantize_rows(tl.where(mask, v, 0.0))
        scale_offsets = block_id * stride_s_b + block_offset * stride_s_s + h * stride_s_h
        tl.store(k_scale_ptr + scale_offsets, k_scale, mask=h < NUM_KV_HEADS)
        tl.store(v_scale_ptr + scale_offsets, v_scale, mask=h < NUM_KV_HEADS)
    tl.store(k_cache_ptr + cache_offsets, k, mask=mask)
    tl.store(v_cache_ptr + cache_offsets, v, mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k[t], v[t] ([num_tokens, num_kv_heads, head_dim]) into the caches at slot_mapping[t] (skip if < 0).

    Float caches take k and v of their own dtype. int8 caches take float k and v (fp32, fp16 or bf16) and need
    k_scale and v_scale (fp16 [num_blocks, block_size, num_kv_heads]), which receive each row's scale.
    """
    quantize = check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    device = k_cache.device
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, 3, FLOAT_DTYPES if quantize else (k_cache.dtype,), device)
        if tuple(x.shape[1:]) != (num_kv_heads, head_dim) or x.stride(-1) != 1:
            raise RuntimeError(
                f"{name} must be [num_tokens, {num_kv_heads}, {head_dim}] contiguous in head_dim, "
                f"got shape {tuple(x.shape)} strides {x.stride()}"
            )
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,), device)
    num_tokens = k.shape[0]
    if v.shape[0] != num_tokens or slot_mapping.shape[0] != num_tokens:
        raise RuntimeError(
            f"k, v and slot_mapping disagree on num_tokens: {num_tokens}, {v.shape[0]}, {slot_mapping.shape[0]}"
        )
    if num_tokens == 0:
        return
    check_launchable(_store_kv_kernel, device)
    k_scale_arg, v_scale_arg, *scale_strides = scale_args(k_cache, k_scale, v_scale)
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, k_scale_arg, v_scale_arg, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *scale_strides,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANTIZE=quantize,
    )  # fmt: skip
