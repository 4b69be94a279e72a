"""TritonAttentionBackend against the torch twins in Triton's interpreter: cache contents and outputs."""

from __future__ import annotations

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.triton_backend import TritonAttentionBackend
from kernels.reference import paged_attention_ref
from tests.kernels.paged_cases import PagedBatch, make_paged_batch

pytestmark = pytest.mark.interpreted


def make_metadata(batch: PagedBatch) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        query_lens_cpu=batch.query_lens,
        seq_lens_cpu=tuple(batch.seq_lens.tolist()),
    )


def forward(backend: TritonAttentionBackend, batch: PagedBatch, meta: AttentionMetadata) -> torch.Tensor:
    """The backend's step over the batch's new tokens and its caches."""
    return backend.forward(
        batch.q,
        batch.k,
        batch.v,
        batch.k_cache,
        batch.v_cache,
        meta,
        batch.scale,
        batch.k_scale,
        batch.v_scale,
    )


@pytest.mark.parametrize("kv_cache_dtype", [None, torch.int8], ids=["float", "int8"])
@pytest.mark.parametrize(
    ("seq_lens", "query_lens"),
    [([1, 15, 17, 100], [1, 1, 1, 1]), ([1, 15, 17, 100, 40], [1, 15, 5, 1, 40])],
    ids=["decode", "mixed"],
)
def test_backend_stores_kv_and_attends(
    seq_lens: list[int], query_lens: list[int], kv_cache_dtype: torch.dtype | None
) -> None:
    batch = make_paged_batch(seq_lens, query_lens, group=3, block_size=16, kv_cache_dtype=kv_cache_dtype)
    expected = batch.stored()
    meta = make_metadata(batch)
    backend = TritonAttentionBackend()
    backend.prepare(meta)
    out = forward(backend, batch, meta)
    for cache, expected_cache in zip(batch.caches(), expected.caches(), strict=True):
        assert torch.equal(cache.nan_to_num(-7.0), expected_cache.nan_to_num(-7.0))
    reference = paged_attention_ref(
        batch.q, expected.k_cache, expected.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens,
        batch.scale, **expected.kv_scales,
    )  # fmt: skip
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_cache_dtype", [None, torch.int8], ids=["float", "int8"])
def test_verification_rows_attend_as_decodes_one_after_another(kv_cache_dtype: torch.dtype | None) -> None:
    """Speculative decoding (issue #40) runs a sequence's token and its k proposed ones as k + 1 decode rows of one
    step (AttentionMetadata entries of one query token, the same block table, seq_lens p + 1 .. p + k + 1): each row
    gets what decoding its position alone after the ones before it gets."""
    batch = make_paged_batch([44], [4], group=3, block_size=16, kv_cache_dtype=kv_cache_dtype)
    table = batch.block_tables[0].tolist()
    backend = TritonAttentionBackend()
    caches = [c.clone() for c in (batch.k_cache, batch.v_cache)]
    scales = [None if s is None else s.clone() for s in (batch.k_scale, batch.v_scale)]
    one_by_one = []
    for j in range(4):  # positions 40..43, a step each
        meta = AttentionMetadata.build([1], [41 + j], [table], 16)
        one_by_one.append(
            backend.forward(
                batch.q[j : j + 1],
                batch.k[j : j + 1],
                batch.v[j : j + 1],
                *caches,
                meta,
                batch.scale,
                *scales,
            )
        )
    meta = AttentionMetadata.build([1] * 4, [41, 42, 43, 44], [table] * 4, 16)
    together = forward(backend, batch, meta)
    torch.testing.assert_close(together, torch.cat(one_by_one), atol=0, rtol=0)
    assert torch.equal(batch.k_cache.nan_to_num(-7.0), caches[0].nan_to_num(-7.0))
