"""Memory on huge pages: the KV pool (zeros of the requested shape and dtype) and the weights' block buffers, on
huge-page-advised memory on a CPU."""

from __future__ import annotations

import gc
import mmap
import os

import pytest
import torch

from engine.native.huge_pages import empty_on_huge_pages, zeros_on_huge_pages


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


def vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping holding `address` (/proc/self/smaps: `hg` = advised for huge pages)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                start, stop = (int(x, 16) for x in head.split("-"))
                inside = start <= address < stop
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages here")
def test_weight_buffer_is_advised_for_huge_pages_and_writable():
    buffer = empty_on_huge_pages((4096, 1024), dtype=torch.uint8)  # 4 MiB: past the threshold
    assert buffer.shape == (4096, 1024) and buffer.dtype == torch.uint8 and buffer.is_contiguous()
    assert "hg" in vm_flags(buffer.data_ptr())
    buffer[-1, -1] = 7
    gc.collect()
    assert buffer[-1, -1].item() == 7
    small = empty_on_huge_pages((16, 16), dtype=torch.uint8)  # below it: torch's own allocator
    assert "hg" not in vm_flags(small.data_ptr())


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages here")
def test_gguf_block_weights_load_onto_huge_pages(tmp_path):
    """The loader reads a linear's blocks into a huge-page buffer (its q/k/v rows fused into one)."""
    from engine.loading.gguf_read import FileTensor, read_block_group
    from engine.native.quant_format import QuantType

    rows, row_bytes = 8192, 144 * 2  # Q4_K rows of 512 weights: 2.4 MB
    data = bytes(range(256)) * (rows * row_bytes // 256)
    path = tmp_path / "blocks.bin"
    path.write_bytes(data)
    part = FileTensor("blk.0.attn_q.weight", "Q4_K", (rows, 512), 0, len(data))
    assert part.qtype is QuantType.Q4_K
    fd = os.open(path, os.O_RDONLY)
    try:
        (weight,) = read_block_group(fd, [part], [None])
    finally:
        os.close(fd)
    assert bytes(weight.blocks.numpy().tobytes()) == data
    assert "hg" in vm_flags(weight.blocks.data_ptr())
