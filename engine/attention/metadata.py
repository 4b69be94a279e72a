"""Attention metadata for one flattened batch, and the choice of attention backend."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
    # (largest block id, largest slot) when the builder knew them from its host lists; else read from the tensors
    host_reach: tuple[int, int] | None = None

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Metadata for sequences whose last query_lens[i] of seq_lens[i] tokens are new this step, each at the
        slots its block table gives them."""
        slots = [
            table[pos // block_size] * block_size + pos % block_size
            for query_len, seq_len, table in zip(query_lens, seq_lens, block_tables, strict=True)
            for pos in range(seq_len - query_len, seq_len)
        ]
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        width = max(len(t) for t in block_tables)
        max_block = max((max(t) for t in block_tables if t), default=0)
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(
                [t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device
            ),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=tuple(query_lens),
            seq_lens_cpu=tuple(seq_lens),
            host_reach=(max_block, max(slots, default=-1)),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @cached_property
    def reach(self) -> tuple[int, int]:
        """(largest block id, largest slot) the step names; (0, -1) when it names none. Computed once a step (from
        the builder's host lists: a tensor max() is a threaded reduction costing ~50 µs at batch 1)."""
        if self.host_reach is not None:
            return self.host_reach
        max_block = int(self.block_tables.max()) if self.block_tables.numel() else 0
        max_slot = int(self.slot_mapping.max()) if self.slot_mapping.numel() else -1
        return max_block, max_slot

    def check_pool(self, num_blocks: int, block_size: int) -> None:
        """Raise RuntimeError when the step names a block or slot past a pool of `num_blocks` blocks: native code
        follows them as raw offsets, unchecked."""
        check_reach(*self.reach, num_blocks, block_size, "attention metadata")

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def check_reach(max_block: int, max_slot: int, num_blocks: int, block_size: int, what: str) -> None:
    """Raise RuntimeError when `what` names a block or slot past a pool of `num_blocks` blocks of `block_size`."""
    if max_block >= num_blocks or max_slot >= num_blocks * block_size:
        raise RuntimeError(
            f"{what} names block {max_block} / slot {max_slot}, past a pool of {num_blocks} blocks of {block_size}"
        )
