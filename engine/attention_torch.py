"""Paged attention in plain torch: the CPU backend (decode batched over gathered blocks, prefill per sequence)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata


class AttentionBackend(Protocol):
    """Stores a step's K/V into the paged cache and attends each query over its sequence's context."""

    def prepare(self, meta: AttentionMetadata) -> None:
        """Precompute per-step state (gather indices, masks) once, before the layers run."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Write k/v at meta.slot_mapping, then causal attention over cached + new context."""
        ...


@dataclass(frozen=True)
class _Prefill:
    """One sequence with more than one query token this step."""

    row_start: int
    row_end: int
    seq_len: int
    block_ids: torch.Tensor | None  # [num_blocks] int64 to gather its context; None: all context is new
    mask: torch.Tensor | None  # [query_len, seq_len] bool, True = attend; None: plain causal


@dataclass(frozen=True)
class _StepPlan:
    """Per-step indices and masks shared by every layer."""

    meta: AttentionMetadata
    block_size: int
    decode_rows: (
        torch.Tensor | None
    )  # [B] int64 query rows of single-token sequences; None: every row, in order
    decode_block_ids: torch.Tensor | None  # [B * nb] int64 blocks to gather, nb covering the longest context
    decode_mask: torch.Tensor | None  # [B, 1, 1, nb * block_size] bool, True = attend
    prefills: tuple[_Prefill, ...]


class TorchAttentionBackend:
    """CPU paged attention; the caches must hold finite values (allocate them with torch.zeros).

    Decode sequences are attended together: their blocks are gathered into [B, L, Hkv, D] (padded to the longest
    context and masked) and fed to SDPA with grouped-query heads. Prefill sequences run one SDPA call each.
    """

    def __init__(self, block_size: int | None = None) -> None:
        self.block_size = block_size  # None: taken from the cache shape at the first forward
        self._plan: _StepPlan | None = None

    def prepare(self, meta: AttentionMetadata) -> None:
        """Build the step plan for `meta` (or, without a known block size, at the step's first forward)."""
        self._plan = None if self.block_size is None else self._make_plan(meta, self.block_size)

    def _make_plan(self, meta: AttentionMetadata, bs: int) -> _StepPlan:
        starts = meta.query_start_loc.tolist()
        tables = meta.block_tables.to(torch.int64)
        decode_seqs = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        prefills = []
        for i, query_len in enumerate(meta.query_lens_cpu):
            if query_len == 1:
                continue
            seq_len = meta.seq_lens_cpu[i]
            block_ids = mask = None
            if seq_len != query_len:  # cached context precedes this step's tokens
                block_ids = tables[i, : -(-seq_len // bs)]
                rows = torch.arange(query_len, device=tables.device)[:, None] + (seq_len - query_len)
                mask = torch.arange(seq_len, device=tables.device)[None, :] <= rows
            prefills.append(_Prefill(starts[i], starts[i] + query_len, seq_len, block_ids, mask))
        decode_rows = decode_ids = decode_mask = None
        if decode_seqs:
            index = torch.tensor(decode_seqs, dtype=torch.int64, device=tables.device)
            if len(decode_seqs) != meta.num_seqs:
                decode_rows = meta.query_start_loc.to(torch.int64)[index]
            max_len = max(meta.seq_lens_cpu[i] for i in decode_seqs)
            num_blocks = -(-max_len // bs)
            decode_ids = tables[index, :num_blocks].reshape(-1)
            lens = meta.seq_lens.to(torch.int64)[index]
            positions = torch.arange(num_blocks * bs, device=tables.device)
            decode_mask = (positions[None, :] < lens[:, None]).view(len(decode_seqs), 1, 1, -1)
        return _StepPlan(meta, bs, decode_rows, decode_ids, decode_mask, tuple(prefills))

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """See AttentionBackend.forward."""
        block_size, num_kv_heads, head_dim = k_cache.shape[1:]
        plan = self._plan
        if plan is None or plan.meta is not meta or plan.block_size != block_size:
            plan = self._plan = self._make_plan(meta, block_size)
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v)
        if plan.decode_block_ids is not None and plan.decode_rows is None:
            return self._decode(q, k_cache, v_cache, plan, scale)
        out = q.new_empty(q.shape)
        if plan.decode_rows is not None:
            out[plan.decode_rows] = self._decode(q[plan.decode_rows], k_cache, v_cache, plan, scale)
        for p in plan.prefills:
            out[p.row_start : p.row_end] = self._prefill(q, k, v, k_cache, v_cache, p, scale)
        return out

    def _decode(self, q, k_cache, v_cache, plan: _StepPlan, scale: float) -> torch.Tensor:
        num_seqs, num_heads, head_dim = q.shape  # [B, Hq, D]
        block_ids = plan.decode_block_ids
        keys = k_cache.index_select(0, block_ids).view(num_seqs, -1, *k_cache.shape[2:])  # [B, L, Hkv, D]
        values = v_cache.index_select(0, block_ids).view(num_seqs, -1, *v_cache.shape[2:])
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, Hq, 1, D]
            keys.transpose(1, 2),  # [B, Hkv, L, D]
            values.transpose(1, 2),
            attn_mask=plan.decode_mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.view(num_seqs, num_heads, head_dim)

    def _prefill(self, q, k, v, k_cache, v_cache, p: _Prefill, scale: float) -> torch.Tensor:
        query = q[p.row_start : p.row_end].transpose(0, 1).unsqueeze(0)  # [1, Hq, Lq, D]
        if p.block_ids is None:
            keys, values = k[p.row_start : p.row_end], v[p.row_start : p.row_end]  # [L, Hkv, D]
        else:
            keys = k_cache.index_select(0, p.block_ids).flatten(0, 1)[: p.seq_len]
            values = v_cache.index_select(0, p.block_ids).flatten(0, 1)[: p.seq_len]
        out = F.scaled_dot_product_attention(
            query,
            keys.transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=p.mask,
            is_causal=p.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)  # [Lq, Hq, D]
