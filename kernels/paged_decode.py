"""Paged decode attention: one new query token per sequence against its whole paged context.

GQA-aware: program (seq, kv_head) loads the NUM_QUERIES_PER_KV query heads that share kv_head as one
[BLOCK_G, head_dim] tile, so every K/V row is read from HBM once per step. Context tokens are walked in tiles of
TILE_N; each token's cache row is found through the block table, so tiles may span several pages.

int8 caches (QUANTIZED) come with an fp16 scale per (token, kv head); see kernels/tiles.py for how it is applied.

Few sequences with long contexts leave most SMs idle, so the split-K (flash-decoding) variant also splits each
context into NUM_SPLITS ranges handled by separate programs, which write unnormalised partial outputs with their
running max and sum; `_decode_reduce_kernel` merges them. `choose_num_splits` picks the variant.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kernels.runtime import (
    TileConfig,
    check_attention_inputs,
    check_launchable,
    check_power_of_two,
    scale_args,
)
from kernels.tiles import load_kv_tile, online_softmax_step, tile_scores

SPLIT_MIN_SEQ_LEN = 1024  # shorter contexts never split: the reduce pass would cost more than it wins
MIN_TOKENS_PER_SPLIT = 256
MAX_NUM_SPLITS = 64
DEFAULT_TILE = TileConfig(tile_n=64, num_warps=4)


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] float, or int8 when QUANTIZED
    v_cache_ptr,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp16, read when QUANTIZED
    v_scale_ptr,
    block_tables_ptr,  # [num_seqs, max_num_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32
    out_ptr,  # [num_seqs, num_heads, head_dim], written when NUM_SPLITS == 1
    part_acc_ptr,  # [num_seqs, num_heads, NUM_SPLITS, HEAD_DIM] fp32, written when NUM_SPLITS > 1
    part_max_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32, log2 domain
    part_sum_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32
    scale_log2,  # softmax scale * log2(e): the kernel works with exp2
    stride_q_s,
    stride_q_h,
    stride_o_s,
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
    BLOCK_G: tl.constexpr,  # NUM_QUERIES_PER_KV padded to a power of two >= 16 (tl.dot's minimum)
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    QUANTIZED: tl.constexpr,  # int8 caches with per-row scales
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    if NUM_SPLITS == 1:
        start = 0
        end = seq_len
    else:
        split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE_N) * TILE_N
        start = split * split_len
        end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * NUM_QUERIES_PER_KV + g
    row_mask = (g[:, None] < NUM_QUERIES_PER_KV) & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_q_s + head[:, None] * stride_q_h + d[None, :], mask=row_mask, other=0.0)

    # the running max starts finite so that an empty split or context yields zero weight instead of NaN
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    block_table = block_tables_ptr + seq * stride_bt_s
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        pos_mask = pos < end
        k, v, k_scale, v_scale = load_kv_tile(  # [TILE_N, BLOCK_D] each, scales [TILE_N]
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_table, pos, pos_mask, d, kv_head,
            stride_c_b, stride_c_s, stride_c_h, stride_s_b, stride_s_s, stride_s_h, BLOCK_SIZE, HEAD_DIM, QUANTIZED,
        )  # fmt: skip

        qk = tile_scores(q, k, k_scale, scale_log2, QUANTIZED)  # [BLOCK_G, TILE_N]
        qk = tl.where(pos_mask[None, :], qk, float("-inf"))
        m_i, l_i, acc = online_softmax_step(qk, v.to(q.dtype), v_scale, m_i, l_i, acc, QUANTIZED)

    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # an empty context (a padding row) outputs zeros
        out = acc / l_safe[:, None]
        out_offsets = seq * stride_o_s + head[:, None] * stride_o_h + d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        num_heads = tl.num_programs(1) * NUM_QUERIES_PER_KV
        part = (seq * num_heads + head) * NUM_SPLITS + split  # [BLOCK_G]
        g_mask = g < NUM_QUERIES_PER_KV
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=row_mask)
        tl.store(part_max_ptr + part, m_i, mask=g_mask)
        tl.store(part_sum_ptr + part, l_i, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr,  # [num_seqs, num_heads, NUM_SPLITS, HEAD_DIM] fp32
    part_max_ptr,  # [num_seqs, num_heads, NUM_SPLITS] fp32
    part_sum_ptr,
    out_ptr,  # [num_seqs, num_heads, head_dim]
    stride_o_s,
    stride_o_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,  # NUM_SPLITS rounded up to a power of two
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + s
    s_mask = s < NUM_SPLITS
    m = tl.load(part_max_ptr + part, mask=s_mask, other=float("-inf"))
    sums = tl.load(part_sum_ptr + part, mask=s_mask, other=0.0)
    acc_mask = s_mask[:, None] & (d[None, :] < HEAD_DIM)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=acc_mask, other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))  # rescale every split to the global max
    total = tl.sum(sums * weight, 0)
    total = tl.where(total == 0.0, 1.0, total)
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(
        out_ptr + seq * stride_o_s + head * stride_o_h + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many context splits per (sequence, kv head): 1 unless programs are fewer than SMs and contexts long."""
    num_programs = num_seqs * num_kv_heads
    if num_programs >= num_sms or max_seq_len < SPLIT_MIN_SEQ_LEN:
        return 1
    fill_sms = -(-2 * num_sms // num_programs)  # about two programs per SM
    return max(1, min(fill_sms, max_seq_len // MIN_TOKENS_PER_SPLIT, MAX_NUM_SPLITS))


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 for the CPU interpreter, so it never splits)."""
    if device.type != "cuda":
        return 1  # the interpreter runs programs one by one: splitting only adds work
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile: TileConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [num_seqs, num_heads, head_dim] (each sequence's last token) over its paged context.

    int8 caches need k_scale and v_scale (fp16 [num_blocks, block_size, num_kv_heads]); q and out stay float.

    max_seq_len (default: the block table's width in tokens) only feeds the split heuristic; num_splits forces
    the plain kernel (1) or split-K with that many splits (> 1) instead of `choose_num_splits`; tile overrides
    DEFAULT_TILE's fields (benchmarks sweep it).
    """
    num_seqs, num_heads, head_dim = q.shape
    quantized = check_attention_inputs(
        q, k_cache, v_cache, block_tables, seq_lens, num_seqs, k_scale, v_scale
    )
    _, block_size, num_kv_heads, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise RuntimeError(
            f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}"
        )
    if num_seqs == 0:
        return out
    check_launchable(_paged_decode_kernel, q.device)
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, num_sms(q.device))
    if num_splits < 1:
        raise RuntimeError(f"num_splits must be at least 1, got {num_splits}")

    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    tile_n = (tile and tile.tile_n) or DEFAULT_TILE.tile_n
    check_power_of_two("tile_n", tile_n, 16)
    options = {**DEFAULT_TILE.launch_options(), **(tile.launch_options() if tile else {})}
    if num_splits == 1:
        part_acc = part_max = part_sum = out  # unused by the kernel when NUM_SPLITS == 1
    else:
        part_acc = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_max = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    k_scale_arg, v_scale_arg, *scale_strides = scale_args(k_cache, k_scale, v_scale)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, k_scale_arg, v_scale_arg, block_tables, seq_lens, out, part_acc, part_max, part_sum,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), *scale_strides, block_tables.stride(0),
        NUM_QUERIES_PER_KV=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        QUANTIZED=quantized,
        **options,
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_acc, part_max, part_sum, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
        )  # fmt: skip
    return out
