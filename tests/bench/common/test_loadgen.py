"""bench/common/loadgen.py: a request's latencies, the load summary, Poisson offsets, the concurrency bound."""

from __future__ import annotations

import asyncio
import math

import pytest

from bench.common import loadgen


def test_request_result_latencies():
    r = loadgen.RequestResult(
        ok=True, start_s=0.0, e2e_s=1.0, ttft_s=0.2, chunk_times_s=[0.2, 0.5, 1.0], num_output_tokens=5
    )
    assert r.itl_s == pytest.approx([0.3, 0.5])
    assert r.tpot_s == pytest.approx(0.2)
    assert math.isnan(loadgen.RequestResult(ok=True, start_s=0.0, num_output_tokens=1).tpot_s)


def test_load_summary_counts_only_successful_requests():
    ok = loadgen.RequestResult(
        ok=True, start_s=0.0, e2e_s=2.0, ttft_s=0.5, chunk_times_s=[0.5, 1.0, 2.0], num_output_tokens=4
    )
    failed = loadgen.RequestResult(ok=False, start_s=0.1, e2e_s=0.1, error="ConnectError: refused")
    s = loadgen.summarise([ok, failed], duration_s=4.0)
    assert (s["num_requests"], s["num_failed"], s["output_tokens"]) == (2, 1, 4)
    assert (s["output_tokens_per_s"], s["requests_per_s"]) == (1.0, 0.25)
    assert s["ttft_ms"]["p50"] == 500.0 and s["tpot_ms"]["p50"] == 500.0 and s["e2e_ms"]["p99"] == 2000.0
    assert s["itl_ms"]["p50"] == 750.0 and s["errors"] == ["ConnectError: refused"]


def test_load_summary_gives_the_servers_own_time_per_token_where_reported():
    def result(timings: dict | None) -> loadgen.RequestResult:
        return loadgen.RequestResult(
            ok=True, start_s=0.0, e2e_s=1.0, ttft_s=0.1, chunk_times_s=[0.1], server_timings=timings
        )

    both = [result({"predicted_per_token_ms": 4.0}), result({"predicted_per_token_ms": 6.0}), result(None)]
    s = loadgen.summarise(both, duration_s=1.0)
    assert (
        s["server_predicted_per_token_ms"]["mean"] == 5.0 and s["server_predicted_per_token_ms"]["p50"] == 5.0
    )
    assert "server_predicted_per_token_ms" not in loadgen.summarise([result(None)], duration_s=1.0)


def test_poisson_offsets_are_seeded_and_increasing():
    offsets = loadgen.poisson_offsets(2000, rate=4.0, seed=7)
    assert offsets == loadgen.poisson_offsets(2000, rate=4.0, seed=7)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:], strict=False))
    assert offsets[-1] / 1999 == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate


def test_run_load_keeps_at_most_concurrency_in_flight():
    in_flight, peak = [0], [0]

    async def send(i: int, start_s: float) -> loadgen.RequestResult:
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.02)
        in_flight[0] -= 1
        return loadgen.RequestResult(ok=True, start_s=start_s, num_output_tokens=i)

    results, _ = asyncio.run(loadgen.run_load(send, 10, concurrency=3))
    assert [r.num_output_tokens for r in results] == list(range(10))
    assert peak[0] == 3
    with pytest.raises(ValueError, match="exactly one"):
        asyncio.run(loadgen.run_load(send, 1))


def test_run_load_sends_on_the_poisson_schedule():
    sent: list[float] = []

    async def send(i: int, start_s: float) -> loadgen.RequestResult:
        sent.append(start_s)
        return loadgen.RequestResult(ok=True, start_s=start_s)

    results, duration = asyncio.run(loadgen.run_load(send, 5, rate=100.0, seed=3))
    expected = loadgen.poisson_offsets(5, 100.0, seed=3)
    assert [r.start_s for r in results] == sorted(sent)
    assert all(0 <= s - e < 0.05 for s, e in zip(sorted(sent), expected, strict=True))
    assert duration >= expected[-1]
