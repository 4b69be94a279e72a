"""Paged prefill attention: causal attention for a flattened batch whose prompts may have a cached prefix.

Sequence i owns query rows [query_start_loc[i], query_start_loc[i+1]); they are the last query_len of its
seq_len context tokens, so a prefix-cache hit or an earlier chunk of a chunked prefill is simply context that is
already in the cache. K/V (this step's included, stored first by `store_kv`) are read through the block table.
A batch may mix prompts and decodes (query_len 1).

int8 caches (QUANTIZED) come with an fp16 scale per (token, kv head); see kernels/tiles.py for how it is applied.

Each program takes BLOCK_Q query tokens of one sequence times the NUM_QUERIES_PER_KV query heads sharing one
KV head: a [BLOCK_M = BLOCK_Q * group, head_dim] tile, so K/V tiles are loaded once per group. It walks the
context in TILE_N tiles up to the tile's last query position, with the online softmax of the Triton
fused-attention tutorial. The grid has one program per (query block, kv head), query blocks numbered across the
batch as query_start_loc[i] // BLOCK_Q + i; each program finds its sequence by binary search, so no host sync or
per-step index tensor is needed.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.runtime import (
    TileConfig,
    check_attention_inputs,
    check_launchable,
    check_power_of_two,
    check_tensor,
    scale_args,
)
from kernels.tiles import load_kv_tile, online_softmax_step, tile_scores


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] float, or int8 when QUANTIZED
    v_cache_ptr,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp16, read when QUANTIZED
    v_scale_ptr,
    block_tables_ptr,  # [num_seqs, max_num_blocks] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_tokens, num_heads, head_dim]
    scale_log2,  # softmax scale * log2(e): the kernel works with exp2
    num_seqs,
    stride_q_t,
    stride_q_h,
    stride_o_t,
    stride_o_h,
    stride_c_b,
    stride_c_s,
    stride_c_h,
    stride_s_b,  # k_scale and v_scale share strides (checked by the launcher)
    stride_s_s,
    stride_s_h,
    stride_bt_s,
    NUM_QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows of the query tile, a power of two >= 16
    BLOCK_Q: tl.constexpr,  # query tokens per tile: BLOCK_M // NUM_QUERIES_PER_KV
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    QUANTIZED: tl.constexpr,  # int8 caches with per-row scales
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)

    # the last sequence whose first query block is at or before this one
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len  # tokens cached before this step

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    token = local_block * BLOCK_Q + r // NUM_QUERIES_PER_KV  # index among this sequence's queries
    head = kv_head * NUM_QUERIES_PER_KV + r % NUM_QUERIES_PER_KV
    row_valid = (r < BLOCK_Q * NUM_QUERIES_PER_KV) & (token < query_len)
    row_mask = row_valid[:, None] & (d[None, :] < HEAD_DIM)
    q_offsets = (q_start + token)[:, None] * stride_q_t + head[:, None] * stride_q_h + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask, other=0.0)
    query_pos = context_len + token  # [BLOCK_M] position of each row's token in the context

    # the running max starts finite so that padding rows yield zero weight instead of NaN
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_bt_s
    kv_end = context_len + tl.minimum(
        (local_block + 1) * BLOCK_Q, query_len
    )  # causal: last row's position + 1
    for tile_start in range(0, kv_end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        pos_mask = pos < kv_end
        k, v, k_scale, v_scale = load_kv_tile(  # [TILE_N, BLOCK_D] each, scales [TILE_N]
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_table, pos, pos_mask, d, kv_head,
            stride_c_b, stride_c_s, stride_c_h, stride_s_b, stride_s_s, stride_s_h, BLOCK_SIZE, HEAD_DIM, QUANTIZED,
        )  # fmt: skip

        qk = tile_scores(q, k, k_scale, scale_log2, QUANTIZED)  # [BLOCK_M, TILE_N]
        visible = pos_mask[None, :] & (pos[None, :] <= query_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), v_scale, m_i, l_i, acc, QUANTIZED)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    out_offsets = (q_start + token)[:, None] * stride_o_t + head[:, None] * stride_o_h + d[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask)


DEFAULT_TILE_N = 64


def default_tile(max_query_len: int, group: int, head_dim: int, quantized: bool = False) -> TileConfig:
    """Up to 128 query rows per program, fewer when every sequence has few queries (mostly decodes).

    Large tiles get 8 warps, and int8 caches count double: converting their K/V tiles to q's dtype takes registers
    (at 128 rows x head_dim 64, 4 warps would spill).
    """
    block_m = max(16, triton.next_power_of_2(group), min(128, triton.next_power_of_2(max_query_len * group)))
    tile_elements = block_m * head_dim * (2 if quantized else 1)
    return TileConfig(
        tile_n=DEFAULT_TILE_N, block_m=block_m, num_warps=8 if tile_elements >= 128 * 128 else 4
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    tile: TileConfig | None = None,
) -> torch.Tensor:
    """Causal attention of q [num_tokens, num_heads, head_dim] over each sequence's paged context.

    int8 caches need k_scale and v_scale (fp16 [num_blocks, block_size, num_kv_heads]); q and the output stay
    float. tile overrides the fields of `default_tile` (benchmarks sweep it).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    quantized = check_attention_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, num_seqs, k_scale, v_scale
    )
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,), q.device)
    if query_start_loc.shape[0] != num_seqs + 1:
        raise RuntimeError(
            f"query_start_loc must have {num_seqs + 1} entries, got {query_start_loc.shape[0]}"
        )
    if max_query_len < 1 and num_tokens > 0:
        raise RuntimeError(f"max_query_len must be at least 1, got {max_query_len}")
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    check_launchable(_paged_prefill_kernel, q.device)
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    default = default_tile(max_query_len, group, head_dim, quantized)
    block_m = (tile and tile.block_m) or default.block_m
    tile_n = (tile and tile.tile_n) or default.tile_n
    check_power_of_two("block_m", block_m, max(16, group))
    check_power_of_two("tile_n", tile_n, 16)
    options = {**default.launch_options(), **(tile.launch_options() if tile else {})}
    block_q = block_m // group
    num_q_blocks = num_tokens // block_q + num_seqs  # an upper bound on sum(cdiv(query_len, block_q))
    k_scale_arg, v_scale_arg, *scale_strides = scale_args(k_cache, k_scale, v_scale)
    _paged_prefill_kernel[(num_q_blocks, num_kv_heads)](
        q, k_cache, v_cache, k_scale_arg, v_scale_arg, block_tables, query_start_loc, seq_lens, out,
        scale * math.log2(math.e), num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *scale_strides, block_tables.stride(0),
        NUM_QUERIES_PER_KV=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_D=triton.next_power_of_2(head_dim),
        TILE_N=tile_n,
        QUANTIZED=quantized,
        **options,
    )  # fmt: skip
    return out
