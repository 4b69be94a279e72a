"""Pieces the paged attention kernels share: loading a tile of K/V through the block table, scoring it, one
online-softmax step.

All are `@triton.jit` functions, inlined into the decode and prefill kernels at compile time (no call overhead).

int8 caches (QUANTIZED) hold each (token, kv head) row as int8 values c_n and one fp16 scale s_n, x_n ~ c_n * s_n.
Rather than dequantizing whole [TILE_N, head_dim] tiles, the kernels apply the scale where it is one number per
context position: q . (c_n * s_n) = (q . c_n) * s_n scales column n of the scores (folded into the multiply by the
softmax scale that is there anyway), and sum_n p_n (c_n * s_n) = sum_n (p_n * s_n) c_n scales column n of the
probabilities before the P.V dot (the softmax sum uses the unscaled p). The int8 values enter tl.dot converted to
q's dtype, which holds integers up to 127 exactly (bf16's 8-bit significand, fp16, tf32), so the dots run on
tensor cores in q's dtype as they do for float caches, and the fp16 scales are never rounded to bf16.
The float path is selected at compile time (QUANTIZED is a constexpr) and compiles to the kernel it was before.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp16, read when QUANTIZED
    v_scale_ptr,
    block_table,  # this sequence's row of the block table
    pos,  # [TILE_N] context positions
    pos_mask,  # [TILE_N] positions that exist
    d,  # [BLOCK_D] head_dim offsets
    kv_head,
    stride_c_b,
    stride_c_s,
    stride_c_h,
    stride_s_b,
    stride_s_s,
    stride_s_h,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANTIZED: tl.constexpr,
):
    """K and V at `pos` ([TILE_N, BLOCK_D] each, zeros where masked), found through the block table, and their
    fp32 scales ([TILE_N] each) when QUANTIZED (unit constants otherwise)."""
    block_id = tl.load(block_table + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
    in_block = pos % BLOCK_SIZE
    row = block_id * stride_c_b + in_block * stride_c_s + kv_head * stride_c_h
    kv_mask = pos_mask[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if QUANTIZED:
        scale_row = block_id * stride_s_b + in_block * stride_s_s + kv_head * stride_s_h
        k_scale = tl.load(k_scale_ptr + scale_row, mask=pos_mask, other=0.0).to(tl.float32)
        v_scale = tl.load(v_scale_ptr + scale_row, mask=pos_mask, other=0.0).to(tl.float32)
    else:
        k_scale = 1.0
        v_scale = 1.0
    return k, v, k_scale, v_scale


@triton.jit
def tile_scores(q, k, k_scale, scale_log2, QUANTIZED: tl.constexpr):
    """Log2-domain scores q k^T [ROWS, TILE_N] of a query tile against a K tile (int8 K: times its row scales)."""
    qk = tl.dot(q, tl.trans(k.to(q.dtype)))  # a no-op cast for float caches, which have q's dtype
    return qk * (k_scale * scale_log2)[None, :] if QUANTIZED else qk * scale_log2


@triton.jit
def online_softmax_step(qk, v, v_scale, m_i, l_i, acc, QUANTIZED: tl.constexpr):
    """Fold one tile of log2-domain scores qk [ROWS, TILE_N] and its values into (max, sum, accumulator).

    v has the dtype of the P.V dot (q's); int8 values' row scales v_scale [TILE_N] weight the probabilities.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if QUANTIZED:
        acc = acc * alpha[:, None] + tl.dot((p * v_scale[None, :]).to(v.dtype), v)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
