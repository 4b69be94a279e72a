"""store_kv against its torch twin in Triton's interpreter: an exact copy into shuffled slots."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import store_kv_ref
from kernels.store_kv import store_kv
from tests.kernels.paged_cases import make_paged_batch

pytestmark = pytest.mark.interpreted


@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(1, 64, 16), (3, 128, 32)])
def test_store_kv_matches_reference(num_kv_heads: int, head_dim: int, block_size: int) -> None:
    batch = make_paged_batch(
        [15, 100, 17], [15, 3, 17], num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size
    )
    slot_mapping = batch.slot_mapping.clone()
    slot_mapping[[2, 20]] = -1  # padding tokens
    expected_k, expected_v = batch.k_cache.clone(), batch.v_cache.clone()
    store_kv_ref(batch.k, batch.v, expected_k, expected_v, slot_mapping)
    store_kv(batch.k, batch.v, batch.k_cache, batch.v_cache, slot_mapping)
    assert torch.equal(batch.k_cache.nan_to_num(-7.0), expected_k.nan_to_num(-7.0))
    assert torch.equal(batch.v_cache.nan_to_num(-7.0), expected_v.nan_to_num(-7.0))
    written = slot_mapping[slot_mapping >= 0]
    assert written.numel() == 33
    assert torch.equal(batch.k_cache.flatten(0, 1)[written], batch.k[slot_mapping >= 0])


def test_store_kv_reads_strided_inputs() -> None:
    # k and v as views into a fused [tokens, q + k + v heads, head_dim] projection output
    k_cache = torch.zeros(4, 16, 2, 64)
    v_cache = torch.zeros(4, 16, 2, 64)
    qkv = torch.randn(5, 8, 64)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([63, 0, 17, 40, 5])
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.flatten(0, 1)[slots], k)
    assert torch.equal(v_cache.flatten(0, 1)[slots], v)
    assert torch.count_nonzero(k_cache.flatten(0, 1)[[1, 2, 62]]) == 0


def test_store_kv_rejects_mismatched_inputs() -> None:
    k_cache = torch.zeros(4, 16, 2, 64)
    v_cache = torch.zeros(4, 16, 2, 64)
    k = torch.zeros(3, 2, 64)
    with pytest.raises(RuntimeError, match="slot_mapping must have dtype"):
        store_kv(k, k, k_cache, v_cache, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"k must be \[num_tokens, 2, 64\]"):
        store_kv(torch.zeros(3, 1, 64), k, k_cache, v_cache, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="v_cache .* must match"):
        store_kv(k, k, k_cache, v_cache.double(), torch.zeros(3, dtype=torch.int64))
