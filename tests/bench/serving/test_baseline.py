"""`bench serving` against OpenAI-compatible fakes: a llama.cpp-like baseline with its own `timings`, rate and
closed-loop points in one run, and one TCP connection per request for every server."""

from __future__ import annotations

import asyncio
import json
import os
import shlex

import pytest

from bench.cli import bench_main
from bench.common import loadgen
from bench.common.workload import chat_requests
from tests.bench.fake_openai import LLAMA_TIMINGS, fake_server


def test_stream_chat_records_llama_cpp_timings_without_keep_alive():
    async def three(url: str) -> list[loadgen.RequestResult]:
        client = loadgen.make_client(url, keep_alive=False)
        request = chat_requests(1, max_tokens=8)[0]
        try:
            return [await loadgen.stream_chat(client, "fake.gguf", request, 0.0) for _ in range(3)]
        finally:
            await client.close()

    with fake_server("fake.gguf", "llamacpp", LLAMA_TIMINGS) as (url, stats):
        results = asyncio.run(three(url))
    assert all(r.ok and r.text == "alpha beta gamma delta " and r.num_output_tokens == 4 for r in results)
    assert all(r.server_timings == LLAMA_TIMINGS for r in results)
    assert (stats.connections, stats.requests) == (3, 3)
    summary = loadgen.summarise(results, duration_s=1.0)
    assert summary["server_predicted_per_token_ms"]["p50"] == pytest.approx(4.2)


def test_serving_bench_runs_rates_and_concurrency_against_a_llama_cpp_baseline(tmp_path, capsys):
    with (
        fake_server("fake-pagedchat", "pagedchat", delay_s=0.1) as (url, ours),
        fake_server("qwen.gguf", "llamacpp", LLAMA_TIMINGS, delay_s=0.1) as (baseline_url, theirs),
    ):
        argv = shlex.split(
            f"serving --model unused --url {url} --baseline-url {baseline_url} --rates 100 --concurrency 4 "
            f"--num-requests 3 --max-tokens 4 --results-dir {tmp_path} --pid {os.getpid()} --baseline-pid {os.getpid()}"
        )  # both fakes serve from this process: its memory stands for both servers'

        assert bench_main(argv) == 0
    (json_path,) = tmp_path.glob("serving-*.json")
    doc = json.loads(json_path.read_text())
    assert doc["baseline"] == {
        "name": "llama.cpp",
        "url": baseline_url,
        "model": "qwen.gguf",
        "started_here": False,
        "memory": doc["servers"]["llama.cpp"]["memory"],
    }
    for name in ("pagedchat", "llama.cpp"):
        memory = doc["servers"][name]["memory"]
        assert 0 < memory["rss_bytes"] <= memory["peak_rss_bytes"], name
    assert set(doc["memory_ratios"]) == {"rss_bytes", "peak_rss_bytes"}
    assert doc["workload"]["keep_alive"] is False
    assert set(doc["systems"]) == {"pagedchat", "llama.cpp"}
    for name, points in doc["systems"].items():
        # the closed-loop point sends max(3, 2 x 4) requests, so 4 are really in flight at once
        assert [(p["load"], p["value"], p["num_requests"], p["num_failed"]) for p in points] == [
            ("rate", 100.0, 3, 0),
            ("concurrency", 4, 8, 0),
        ], name
        # a point sends the first num_requests of the workload; the fake answers max_tokens (at most 4) words
        budgets = doc["workload"]["max_tokens"]
        assert [p["output_tokens"] for p in points] == [sum(budgets[:3]), sum(budgets[:8])], name
    assert all(p["server_predicted_per_token_ms"]["p50"] == 4.2 for p in doc["systems"]["llama.cpp"])
    assert all("server_predicted_per_token_ms" not in p for p in doc["systems"]["pagedchat"])
    assert set(doc["ratios"]) == {"rate=100", "concurrency=4"}
    assert all(r["output_tokens_per_s"] > 0 and r["ttft_p50"] > 0 for r in doc["ratios"].values())
    for stats, model in ((ours, "fake-pagedchat"), (theirs, "qwen.gguf")):
        # /v1/models, the warm-up, 3 + 8 chats: each on its own connection
        assert (stats.requests, stats.connections, stats.peak_in_flight) == (13, 13, 4)
        assert set(stats.models_asked) == {model}  # the id read from /v1/models
    out = capsys.readouterr().out
    assert "server ms/tok" in out and "peak RSS MB" in out
    rows = {line.split()[0] + " " + line.split()[1]: line.split() for line in out.splitlines() if "=" in line}
    assert rows["llama.cpp concurrency=4"][-2] == "4.20" and rows["pagedchat concurrency=4"][-2] == "-"
