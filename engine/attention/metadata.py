"""Attention metadata for one flattened batch, and the choice of attention backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Where a step's tokens sit in the batch and in the paged KV cache.

    The batch is flattened: sequence i owns query rows [query_start_loc[i], query_start_loc[i+1]). Its context after
    this step is seq_lens[i] tokens, of which the last (query_start_loc[i+1] - query_start_loc[i]) are new this step;
    the earlier ones already have KV in the cache (a prefix-cache hit, an earlier prefill chunk, or earlier decodes).
    Block table rows are padded past ceil(seq_lens[i] / block_size) with 0; kernels never read those entries.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset for each new token's K/V
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cumulative query lengths starting at 0
    seq_lens: torch.Tensor  # [num_seqs] int32: context length (cached + new) after this step
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32
    max_query_len: int
    max_seq_len: int
    # host copies, so the torch backend can loop or branch without device syncs
    query_lens_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
