"""The compiled streaming reader sums every element once: vector body, tail, chunk boundaries, any thread count."""

from __future__ import annotations

import pytest
import torch

from engine.native.stream import load_stream_reader

READER = load_stream_reader()
pytestmark = pytest.mark.skipif(
    READER is None, reason="no C compiler: the native reader cannot be built here"
)


@pytest.mark.parametrize("num_floats", [1, 7, 64, 65, 2**16, 2**16 + 1, 3 * 2**16 + 77])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_sum_of_a_known_buffer(num_floats, num_threads):
    buffer = (torch.arange(num_floats) % 7).float()  # small integers: every partial sum is exact in fp32
    expected = sum(i % 7 for i in range(num_floats))
    assert READER.read(buffer, num_threads) == expected
