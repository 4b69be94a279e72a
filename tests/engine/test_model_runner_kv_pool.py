"""The KV pool allocation: zeros of the requested shape and dtype, on huge-page-advised memory on a CPU."""

from __future__ import annotations

import gc

import pytest
import torch

from engine.worker.kv_cache import zeros_on_huge_pages


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_large_pool_is_zeroed_writable_and_outlives_its_mapping_handle(dtype):
    shape = (3, 2, 700, 16, 3, 64)  # 12.9 MB in bf16: past the 2 MiB threshold
    pool = zeros_on_huge_pages(shape, dtype=dtype, device=torch.device("cpu"))
    assert pool.shape == shape and pool.dtype == dtype and pool.is_contiguous()
    assert not pool.any()
    pool[2, 1, 699, 15] = 1.5  # the last element of the mapping
    pool.view(-1)[:7].fill_(-2.0)
    gc.collect()  # the mmap object is referenced only by the tensor now
    assert pool[2, 1, 699, 15].eq(1.5).all() and pool.view(-1)[:7].eq(-2.0).all()
    assert pool.sum().item() == 1.5 * 3 * 64 - 14.0


def test_small_pool_is_plain_torch_zeros():
    pool = zeros_on_huge_pages((2, 4), dtype=torch.float32, device=torch.device("cpu"))
    assert torch.equal(pool, torch.zeros(2, 4))
