"""Attention backend built on the Triton kernels: store this step's K/V, then paged decode or prefill attention."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from kernels.paged_decode import paged_decode_attention
from kernels.paged_prefill import paged_prefill_attention
from kernels.store_kv import store_kv


class TritonAttentionBackend:
    """Paged attention with Triton kernels (compiled on CUDA; interpreted on CPU when TRITON_INTERPRET=1)."""

    def prepare(self, meta: AttentionMetadata) -> None:
        """Nothing to precompute: the kernels read AttentionMetadata's tensors directly."""

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16, with int8 caches
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Store k, v at meta.slot_mapping, then attend each sequence's queries to its context: [num_tokens, num_heads, head_dim].

        int8 caches are quantized on store and dequantized on read with k_scale/v_scale; q, k, v and the output
        stay float.
        """
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        if meta.is_decode_only:
            return paged_decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, max_seq_len=meta.max_seq_len,
                k_scale=k_scale, v_scale=v_scale,
            )  # fmt: skip
        # a step may mix prompt chunks with decodes: the prefill kernel handles any query lengths
        return paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            meta.max_query_len,
            k_scale=k_scale,
            v_scale=v_scale,
        )
