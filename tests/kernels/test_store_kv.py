"""store_kv against its torch twin in Triton's interpreter: an exact copy (or int8 quantization) into shuffled slots."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import store_kv_ref
from kernels.store_kv import store_kv
from tests.kernels.paged_cases import PagedBatch, make_paged_batch

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


def int8_store_case(dtype: torch.dtype) -> tuple[PagedBatch, torch.Tensor]:
    """An int8 batch (3 kv heads, head_dim 80: both padded in the kernel) with edge rows, and slots with padding."""
    batch = make_paged_batch(
        [15, 100, 17], [15, 3, 17], num_kv_heads=3, head_dim=80, dtype=dtype, kv_cache_dtype=torch.int8
    )
    batch.k[4] = 0.0  # zero rows: scale 0, values 0
    batch.v[4, 1] = 0.0
    batch.k[5, 0] *= 1e8  # max|x| / 127 overflows fp16: the scale clamps to 65504, the values to +-127
    # max|x| = 31.75 gives the scale 0.25 exactly, so x / scale lands on halves: floor(x / scale + 0.5) rounds up
    batch.v[6, 2] = 0.0
    batch.v[6, 2, :7] = 0.25 * torch.tensor([127.0, -127.0, 0.5, 1.5, -0.5, -2.5, 2.5])
    slot_mapping = batch.slot_mapping.clone()
    slot_mapping[[2, 20]] = -1  # padding tokens
    return batch, slot_mapping


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_store_kv_int8_matches_reference_bit_for_bit(dtype: torch.dtype) -> None:
    batch, slot_mapping = int8_store_case(dtype)
    expected = [cache.clone() for cache in batch.caches()]
    store_kv_ref(batch.k, batch.v, *expected[:2], slot_mapping, *expected[2:])
    store_kv(batch.k, batch.v, batch.k_cache, batch.v_cache, slot_mapping, batch.k_scale, batch.v_scale)
    for out, ref in zip(batch.caches(), expected, strict=True):
        assert torch.equal(out.nan_to_num(-7.0), ref.nan_to_num(-7.0))  # NaN: slots never written
    slot = slot_mapping.tolist()
    flat = [cache.flatten(0, 1) for cache in batch.caches()]  # [slots, heads, (head_dim)]
    k_values, v_values, k_scale, v_scale = flat
    assert torch.count_nonzero(k_values[slot[4]]) == 0 and torch.count_nonzero(k_scale[slot[4]]) == 0
    assert torch.count_nonzero(v_values[slot[4], 1]) == 0 and v_scale[slot[4], 1] == 0
    assert k_scale[slot[5], 0] == 65504.0 and k_values[slot[5], 0].abs().max() == 127
    assert v_scale[slot[6], 2] == 0.25
    assert v_values[slot[6], 2, :8].tolist() == [127, -127, 1, 2, 0, -2, 3, 0]
    written, skipped = slot_mapping[slot_mapping >= 0], batch.slot_mapping[slot_mapping < 0]
    assert not v_scale[written].isnan().any() and v_scale[skipped].isnan().all()


def test_store_kv_rejects_missing_or_mismatched_scales() -> None:
    k_cache = torch.zeros(4, 16, 2, 64, dtype=torch.int8)
    scale = torch.zeros(4, 16, 2, dtype=torch.float16)
    k = torch.zeros(3, 2, 64)
    slots = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="int8 caches need k_scale and v_scale"):
        store_kv(k, k, k_cache, k_cache.clone(), slots)
    with pytest.raises(RuntimeError, match="int8 caches need k_scale and v_scale"):
        store_kv(k, k, k_cache, k_cache.clone(), slots, scale)
    with pytest.raises(RuntimeError, match="only for int8 caches, got torch.float32"):
        store_kv(k, k, k_cache.float(), k_cache.float(), slots, scale, scale.clone())
    with pytest.raises(RuntimeError, match="v_scale must have dtype"):
        store_kv(k, k, k_cache, k_cache.clone(), slots, scale, scale.float())
    with pytest.raises(
        RuntimeError, match=r"k_scale must be \[num_blocks, block_size, num_kv_heads\] = \(4, 16, 2\)"
    ):
        store_kv(k, k, k_cache, k_cache.clone(), slots, scale[:, :8], scale.clone())
    with pytest.raises(RuntimeError, match="k_scale and v_scale must share strides"):
        store_kv(
            k, k, k_cache, k_cache.clone(), slots, scale, scale.transpose(0, 1).contiguous().transpose(0, 1)
        )
    with pytest.raises(RuntimeError, match="k must have dtype"):
        store_kv(k.to(torch.int8), k, k_cache, k_cache.clone(), slots, scale, scale.clone())
