"""`bench memory`: its summary of paged against contiguous KV, and a run end to end on a tiny random model."""

from __future__ import annotations

import shlex

import pytest

from bench.cli import bench_main
from bench.memory import command as memory
from tests.bench.helpers import SMOLLM2_135M, only_result


def test_memory_bench_reports_waste_and_concurrency(tiny_model, tmp_path):
    argv = shlex.split(
        f"memory --model {tiny_model} --dtype float32 --max-model-len 64 --budget-seqs 2 "
        f"--num-requests 6 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "memory")
    pool, summary = doc["pool"], doc["summary"]
    assert pool["max_model_len"] == 64 and pool["pool_tokens"] == 128
    assert summary["contiguous_capacity"] == 2
    assert 0 <= summary["max_waste_per_seq_tokens"] < pool["block_size"]  # paged waste is under one block
    assert 0 <= summary["paged_waste_pct"] < summary["contiguous_waste_pct"]
    assert summary["peak_running"] >= 2 and len(doc["workload"]["lengths"]) == 6
    assert doc["timeline"] and doc["timeline"][-1]["num_running"] == 0
    by_dtype = doc["by_kv_cache_dtype"]  # int8 by default beside the float pool, at the same bytes
    assert list(by_dtype) == ["pagedchat", "pagedchat-int8kv"]
    int8 = by_dtype["pagedchat-int8kv"]["pool"]
    assert int8["kv_cache_dtype"] == "int8" and int8["kv_cache_bytes"] == pool["kv_cache_bytes"]
    assert int8["num_blocks"] == pool["kv_cache_bytes"] // int8["block_bytes"] > pool["num_blocks"]
    assert by_dtype["pagedchat-int8kv"]["summary"]["peak_running"] >= summary["peak_running"]
    assert [t["name"] for t in doc["targets"]] == [
        "paged KV waste %",
        "concurrency vs contiguous reservation",
    ]


def test_kv_bytes_per_token_of_smollm2_in_bf16():
    assert memory.kv_bytes_per_token(SMOLLM2_135M, element_size=2) == 2 * 30 * 3 * 64 * 2


def test_memory_summary_compares_paged_with_contiguous():
    samples = [
        memory.StepSample(
            1,
            num_running=4,
            num_waiting=2,
            num_tokens_stored=90,
            num_slots_allocated=96,
            num_used_blocks=6,
            future_tokens=100,
        ),
        memory.StepSample(
            2,
            num_running=2,
            num_waiting=0,
            num_tokens_stored=30,
            num_slots_allocated=32,
            num_used_blocks=2,
            future_tokens=20,
        ),
    ]
    s = memory.summarise(samples, max_model_len=64, contiguous_capacity=2)
    assert s["paged_waste_pct"] == pytest.approx(100 * 8 / 128)
    assert s["contiguous_waste_pct"] == pytest.approx(100 * (384 - 120) / 384)
    assert s["contiguous_reserved_future_pct"] == pytest.approx(100 * 120 / 384)
    assert s["mean_running_saturated"] == 4.0  # only the step with a waiting request counts
    assert (s["peak_running"], s["concurrency_ratio"]) == (4, 2.0)
