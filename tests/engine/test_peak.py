"""The compute-peak loops (engine/native/peak.c) do the work they count: the int8 loop's accumulators hold exactly
the dot products it claims to have computed, and both rates are positive on a CPU with AVX2 and FMA."""

from __future__ import annotations

import pytest

from engine.native.peak import load_peak_loops, measure_peak

LOOPS = load_peak_loops()
pytestmark = pytest.mark.skipif(LOOPS is None, reason="no C compiler: the native loops cannot be built here")
HAS_AVX2 = LOOPS is not None and LOOPS.fp32(1, 1)[0] > 0


def expected_int8_checksum(iterations: int, threads: int) -> int:
    """Chain c's operand bytes start at 5 + c and grow by 1 (mod 256) before each use; times x = 3 in pairs then
    pairs of pairs (AVX2) or in fours (vpdpbusd), lane 0 gains 4 * 3 * u an iteration. The checksum sums lane 0 of 8
    chains on every thread."""
    per_thread = sum(12 * ((5 + c + i) % 256) for c in range(8) for i in range(1, iterations + 1))
    return per_thread * threads


@pytest.mark.skipif(not HAS_AVX2, reason="the loops are AVX2 + FMA only")
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_loop_computes_the_products_it_counts(threads):
    rate, checksum = LOOPS.int8(1000, threads)
    assert rate > 0
    assert checksum == expected_int8_checksum(1000, threads)


@pytest.mark.skipif(not HAS_AVX2, reason="the loops are AVX2 + FMA only")
def test_measured_peak_is_positive_on_the_threads_asked_for():
    peak = measure_peak(2, iterations=200_000)
    assert peak is not None and peak.threads == 2
    assert peak.fp32_gflops > 0 and peak.int8_gops > 0
