"""The benchmark suite's pure pieces: statistics, tables, targets, workloads, shapes, SSE parsing, summaries."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from bench.common import loadgen, report, servers, workload
from bench.common.session_client import iter_sse
from engine.core.config import EngineConfig


def test_percentiles_interpolate_linearly():
    assert report.percentiles([4.0, 1.0, 3.0, 2.0]) == pytest.approx({"p50": 2.5, "p90": 3.7, "p99": 3.97})
    assert report.percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}
    assert all(math.isnan(v) for v in report.percentiles([]).values())


def test_target_verdicts_and_lines():
    assert report.Target("speedup", 2.0, 2.0).line() == "PASS  speedup: 2.00 (target >= 2.00)"
    assert report.Target("speedup", 1.99, 2.0).line() == "FAIL  speedup: 1.99 (target >= 2.00)"
    assert report.Target("waste %", 3.5, 4.0, "<=").passed
    assert not report.Target("waste %", 4.5, 4.0, "<=").passed
    assert not report.Target("nan", float("nan"), 0.0).passed


def test_format_table_aligns_columns():
    text = report.format_table(["system", "tok/s"], [["ours", 1234.5], ["hf", 0.5]])
    assert text.splitlines() == ["system  tok/s", "------  -----", "ours     1234", "hf        0.5"]


def test_write_results_writes_json_with_nulls_and_a_png(tmp_path):
    fig, (ax,) = report.new_figure()
    ax.plot([0, 1], [1, 2])
    json_path, png_path = report.write_results("demo", {"value": float("nan"), "n": 3}, fig, tmp_path, "cmd")
    doc = json.loads(json_path.read_text())
    assert json_path.name.startswith("demo-") and json_path.suffix == ".json"
    assert (doc["benchmark"], doc["command"], doc["value"], doc["n"]) == ("demo", "cmd", None, 3)
    assert doc["machine"]["num_cpus"] >= 1
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chat_requests_are_seeded_and_bounded():
    first = workload.chat_requests(40, seed=3, max_tokens=128)
    assert first == workload.chat_requests(40, seed=3, max_tokens=128)
    assert first != workload.chat_requests(40, seed=4, max_tokens=128)
    assert all(32 <= r.max_tokens <= 128 for r in first)
    assert {r.kind for r in first} == {"short", "medium", "long"}
    assert all(r.messages[0]["role"] == "user" and r.messages[0]["content"] for r in first)


def test_length_mix_fits_max_model_len():
    mix = workload.length_mix(500, seed=0, max_model_len=4096)
    assert all(4 <= p <= 2048 and o >= 1 and p + o <= 4096 for p, o in mix)
    assert workload.lognormal_lengths(3, 0, median=100, sigma=0.0, lo=1, hi=1000) == [100, 100, 100]
    assert workload.lognormal_lengths(2, 0, median=100, sigma=0.0, lo=1, hi=50) == [50, 50]


def test_user_turns_are_seeded_per_user():
    assert workload.user_turns(0, 10, seed=1) == workload.user_turns(0, 10, seed=1)
    assert workload.user_turns(0, 10, seed=1) != workload.user_turns(1, 10, seed=1)
    assert len(workload.user_turns(5, 10, seed=1)) == 10


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


def test_iter_sse_parses_events():
    class FakeResponse:
        async def aiter_lines(self):
            for line in [
                "event: delta",
                'data: {"text": "Hi"}',
                "",
                ": ping",
                "",
                "data: plain",
                "",
                "event: done",
                "data: {}",
            ]:
                yield line

    async def events() -> list[tuple[str, str]]:
        return [event async for event in iter_sse(FakeResponse())]

    assert asyncio.run(events()) == [
        ("delta", '{"text": "Hi"}'),
        ("message", "plain"),
        ("done", "{}"),
    ]


def test_engine_env_maps_config_to_server_variables():
    env = servers.engine_env(EngineConfig(model="/m", kv_cache_bytes=1024, enable_prefix_caching=False))
    assert env["PAGEDCHAT_MODEL"] == "/m" and env["PAGEDCHAT_KV_CACHE_BYTES"] == "1024"
    assert env["PAGEDCHAT_ENABLE_PREFIX_CACHING"] == "0" and env["PAGEDCHAT_BLOCK_SIZE"] == "16"
    assert "PAGEDCHAT_MAX_MODEL_LEN" not in env  # None: the server's own default
    assert 0 < servers.free_port() < 65536


def test_a_baseline_given_by_url_is_named_after_its_models_entry():
    assert servers.baseline_name({"id": "m.gguf", "owned_by": "llamacpp"}) == "llama.cpp"
    assert servers.baseline_name({"id": "m"}) == "baseline"
