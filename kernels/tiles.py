"""Pieces the paged attention kernels share: loading a tile of K/V through the block table, one online-softmax step.

Both are `@triton.jit` functions, inlined into the decode and prefill kernels at compile time (no call overhead).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    block_table,  # this sequence's row of the block table
    pos,  # [TILE_N] context positions
    pos_mask,  # [TILE_N] positions that exist
    d,  # [BLOCK_D] head_dim offsets
    kv_head,
    stride_c_b,
    stride_c_s,
    stride_c_h,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """K and V at `pos` ([TILE_N, BLOCK_D] each, zeros where masked), found through the block table."""
    block_id = tl.load(block_table + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
    row = block_id * stride_c_b + (pos % BLOCK_SIZE) * stride_c_s + kv_head * stride_c_h
    kv_mask = pos_mask[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc):
    """Fold one tile of log2-domain scores qk [ROWS, TILE_N] and its values into (max, sum, accumulator)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
