"""Scatter one step's new keys and values into the paged KV cache.

Token t's K/V go to slot `slot_mapping[t]`, i.e. block `slot // block_size`, row `slot % block_size` of the cache
`[num_blocks, block_size, num_kv_heads, head_dim]`. A negative slot marks a padding token and is skipped.
One program copies one token: all of its KV heads at once, as one [heads, head_dim] tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.runtime import check_kv_cache, check_launchable, check_tensor


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    v_ptr,
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    slot_mapping_ptr,  # [num_tokens] int64
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_c_b,  # k_cache and v_cache share strides (checked by the launcher)
    stride_c_s,
    stride_c_h,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,  # NUM_KV_HEADS rounded up to a power of two
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
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
    tl.store(k_cache_ptr + cache_offsets, k, mask=mask)
    tl.store(v_cache_ptr + cache_offsets, v, mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k[t], v[t] ([num_tokens, num_kv_heads, head_dim]) into the caches at slot_mapping[t] (skip if < 0)."""
    check_kv_cache(k_cache, v_cache)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    device = k_cache.device
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, 3, (k_cache.dtype,), device)
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
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )  # fmt: skip
