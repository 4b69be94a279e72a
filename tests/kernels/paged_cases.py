"""Factories for paged-attention test batches: ragged sequences in a shuffled pool, shared prefixes, int8 caches."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernels.reference import store_kv_ref

# int8 against float caches: every value is off by at most half a step, max|row| / 254 (0.4% of the row's largest
# |x|: <= 0.018 for these randn rows, max ~4.5). V's error reaches the output at most that large (a convex
# combination); K's arrives through the scores, as scale * q . dk, a sum of head_dim random-sign errors (~0.005 in
# the logits). Measured over 10 seeds (decode and prefill): max |error| <= 0.04, mean <= 0.0026.
INT8_VS_FLOAT_ATOL = 0.06
INT8_VS_FLOAT_MEAN = 0.004


@dataclass(frozen=True)
class PagedBatch:
    """A flattened batch whose cached context is already in the pool and whose new tokens' K/V are not yet."""

    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]: this step's new keys
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32, padded with 0
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_lens: tuple[int, ...]
    scale: float
    k_scale: torch.Tensor | None = None  # [num_blocks, block_size, num_kv_heads] fp16, with int8 caches
    v_scale: torch.Tensor | None = None

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens.tolist(), default=0)

    @property
    def kv_scales(self) -> dict[str, torch.Tensor | None]:
        """The k_scale / v_scale keyword arguments of the kernels and twins (None for float caches)."""
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def caches(self) -> tuple[torch.Tensor, ...]:
        """The cache tensors a copy-on-write must copy: values, then scales when int8."""
        return tuple(x for x in (self.k_cache, self.v_cache, self.k_scale, self.v_scale) if x is not None)

    def spare_block_ids(self) -> list[int]:
        """Pool blocks that no sequence's table uses."""
        block_size = self.k_cache.shape[1]
        used = {
            block_id
            for table, seq_len in zip(self.block_tables.tolist(), self.seq_lens.tolist(), strict=True)
            for block_id in table[: -(-seq_len // block_size)]
        }
        return [block_id for block_id in range(self.k_cache.shape[0]) if block_id not in used]

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block src to block dst in every cache tensor (values and scales), as copy-on-write does."""
        for cache in self.caches():
            cache[dst] = cache[src]

    def stored(self) -> PagedBatch:
        """This batch with the new tokens' K/V written to (copies of) the caches, as attention expects them."""
        k_cache, v_cache, *scales = (x.clone() for x in self.caches())
        store_kv_ref(self.k, self.v, k_cache, v_cache, self.slot_mapping, *scales)
        k_scale, v_scale = scales or (None, None)
        return replace(self, k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale)


def make_paged_batch(
    seq_lens: list[int],
    query_lens: list[int] | None = None,
    *,
    num_kv_heads: int = 2,
    group: int = 1,
    head_dim: int = 64,
    block_size: int = 16,
    shared_prefix_blocks: int = 0,
    num_spare_blocks: int = 5,
    dtype: torch.dtype = torch.float32,
    kv_cache_dtype: torch.dtype | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> PagedBatch:
    """Sequences with seq_lens[i] context tokens, the last query_lens[i] (default 1: decode) new this step.

    Blocks are a random permutation of the pool, so tables are non-contiguous; with shared_prefix_blocks=n,
    sequences 0 and 1 share their first n (full, cached) blocks as a prefix-cache hit would. Every pool slot
    that holds no context is NaN, so a kernel that reads past a sequence's end poisons its output.
    kv_cache_dtype=torch.int8 (default: dtype) quantizes the cache; q, k and v stay `dtype`, and the NaN poison is
    in the scales of the slots without context.
    """
    query_lens = [1] * len(seq_lens) if query_lens is None else query_lens
    gen = torch.Generator().manual_seed(seed)
    num_blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(num_blocks_per_seq) - shared_prefix_blocks + num_spare_blocks
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    scales: tuple[torch.Tensor, ...] = ()
    if kv_cache_dtype == torch.int8:
        k_cache = torch.full(shape, 127, dtype=torch.int8)
        v_cache = torch.full(shape, 127, dtype=torch.int8)
        scales = tuple(torch.full(shape[:3], float("nan"), dtype=torch.float16) for _ in range(2))
    else:
        k_cache = torch.full(shape, float("nan"), dtype=kv_cache_dtype or dtype)
        v_cache = torch.full(shape, float("nan"), dtype=kv_cache_dtype or dtype)
    block_tables = torch.zeros(len(seq_lens), max(num_blocks_per_seq, default=1), dtype=torch.int32)
    keys, values, slots, prefix_kv = [], [], [], None
    for i, (seq_len, query_len, n) in enumerate(zip(seq_lens, query_lens, num_blocks_per_seq, strict=True)):
        assert 0 < query_len <= seq_len, f"bad lengths {seq_len=} {query_len=}"
        table = [pool.pop() for _ in range(n)]
        kv = torch.randn(2, seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        if shared_prefix_blocks and i == 1:
            assert shared_prefix_blocks * block_size <= seq_len - query_len, (
                "shared blocks must be cached context"
            )
            table[:shared_prefix_blocks] = block_tables[0, :shared_prefix_blocks].tolist()
            kv[:, : shared_prefix_blocks * block_size] = prefix_kv
        if shared_prefix_blocks and i == 0:
            assert shared_prefix_blocks * block_size <= seq_len - query_len, (
                "shared blocks must be cached context"
            )
            prefix_kv = kv[:, : shared_prefix_blocks * block_size]
        block_tables[i, :n] = torch.tensor(table, dtype=torch.int32)
        seq_slots = torch.tensor(
            [table[p // block_size] * block_size + p % block_size for p in range(seq_len)]
        )
        context = seq_len - query_len
        store_kv_ref(kv[0, :context], kv[1, :context], k_cache, v_cache, seq_slots[:context], *scales)
        keys.append(kv[0, context:])
        values.append(kv[1, context:])
        slots.append(seq_slots[context:])
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.cumsum(torch.tensor(query_lens), 0).tolist()], dtype=torch.int32)
    batch = PagedBatch(
        q=q,
        k=torch.cat(keys),
        v=torch.cat(values),
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=torch.cat(slots).to(torch.int64),
        block_tables=block_tables,
        query_start_loc=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_lens=tuple(query_lens),
        scale=head_dim**-0.5,
        k_scale=scales[0] if scales else None,
        v_scale=scales[1] if scales else None,
    )
    return PagedBatch(**{key: _to(value, device) for key, value in batch.__dict__.items()})


def _to(value: object, device: str) -> object:
    return value.to(device) if isinstance(value, torch.Tensor) else value
