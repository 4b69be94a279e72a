"""Pure-torch twins of the paged-attention kernels: plain per-sequence loops, the oracle the kernels are tested against.

Same signatures as the kernels (performance knobs are accepted and ignored). Scores and softmax are computed in fp32;
outputs have q's dtype. int8 caches come with fp16 scales [num_blocks, block_size, num_kv_heads] (k_scale, v_scale):
stores quantize with quantize_kv_ref, attention dequantizes the gathered context with dequantize_kv_ref.
"""

from __future__ import annotations

import torch

INT8_KV_MAX = 127  # int8 KV values lie in [-127, 127]; the scale maps the row's largest |x| to 127


def quantize_kv_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each row of x [..., head_dim]: (int8 values [..., head_dim], fp16 scales [...]).

    scale = fp16(max|x| / 127); q = clamp(floor(x / scale + 0.5), -127, 127), computed in fp32 with the scale already
    rounded to fp16 (q = 0 where the scale is 0). Every int8 store (C, Triton) follows these exact fp32 operations, so
    the kernels match this twin bit for bit. Dequantized, x ~ q * scale.
    """
    xf = x.float()
    scale = (xf.abs().amax(-1) / INT8_KV_MAX).clamp(max=torch.finfo(torch.float16).max).to(torch.float16)
    s = scale.float().unsqueeze(-1)
    q = torch.where(s > 0, torch.floor(xf / torch.where(s > 0, s, 1.0) + 0.5), 0.0)
    return q.clamp(-INT8_KV_MAX, INT8_KV_MAX).to(torch.int8), scale


def dequantize_kv_ref(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of int8 rows q [..., head_dim] with their fp16 scales [...]."""
    return q.float() * scale.float().unsqueeze(-1)


def is_quantized(k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    """Whether the caches are int8; raise RuntimeError unless scales come with int8 caches and only with them."""
    quantized = k_cache.dtype == torch.int8
    if (k_scale is None) != (v_scale is None) or quantized != (k_scale is not None):
        raise RuntimeError(
            f"k_scale and v_scale go with int8 caches, and only with them (caches {k_cache.dtype})"
        )
    return quantized


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k[t], v[t] into the caches at slot_mapping[t]; negative slots are padding and skipped.

    Into int8 caches, each (token, kv head) row is quantized and its scale written at the same slot of k_scale/v_scale.
    """
    quantized = is_quantized(k_cache, k_scale, v_scale)
    if quantized:
        (k, k_row_scale), (v, v_row_scale) = quantize_kv_ref(k), quantize_kv_ref(v)
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = k[token]
        v_cache[slot // block_size, slot % block_size] = v[token]
        if quantized:
            k_scale[slot // block_size, slot % block_size] = k_row_scale[token]
            v_scale[slot // block_size, slot % block_size] = v_row_scale[token]


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's first seq_len cached tokens, [seq_len, *cache.shape[2:]], read through its block table."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = [cache[block_id] for block_id in block_table[:num_blocks].tolist()]
    if not blocks:
        return cache.new_empty((0, *cache.shape[2:]))
    return torch.cat(blocks)[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's queries (the last query_len of its seq_len tokens) over its paged context."""
    quantized = is_quantized(k_cache, k_scale, v_scale)
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        query = q[starts[i] : starts[i + 1]].float()  # [query_len, num_heads, head_dim]
        query_len = query.shape[0]
        if query_len == 0 or seq_len == 0:
            continue
        key = gather_context(k_cache, block_tables[i], seq_len).float()  # [seq_len, num_kv_heads, head_dim]
        value = gather_context(v_cache, block_tables[i], seq_len).float()
        if quantized:
            key = dequantize_kv_ref(key, gather_context(k_scale, block_tables[i], seq_len))
            value = dequantize_kv_ref(value, gather_context(v_scale, block_tables[i], seq_len))
        # query head h reads kv head h // group
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query, key) * scale  # [num_heads, query_len, seq_len]
        query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)
        scores = scores.masked_fill(key_pos[None, None, :] > query_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[i] : starts[i + 1]] = torch.einsum("hqk,khd->qhd", probs, value).to(q.dtype)
    return out


def paged_decode_attention_ref(
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
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence (the last of its seq_len tokens); written into `out` when given."""
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    result = paged_attention_ref(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, k_scale=k_scale, v_scale=v_scale
    )
    if out is None:
        return result
    out.copy_(result)
    return out


def paged_prefill_attention_ref(
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
) -> torch.Tensor:
    """Causal attention for a flattened batch of prompts (or prompt chunks) whose prefixes may already be cached."""
    return paged_attention_ref(
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, k_scale=k_scale, v_scale=v_scale
    )
