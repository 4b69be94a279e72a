"""`bench step` on a tiny random GGUF model: every batch size timed, parts that add up to the step, the linears'
rate and the cores' peak beside it."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main
from tests.engine.gguf_factories import write_tiny_chat_gguf


def test_step_breakdown_at_two_batch_sizes(tmp_path):
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=3)
    argv = f"step --model {model} --kv-cache-bytes {2**24} --batch-sizes 1,3 --steps 4 --results-dir {tmp_path / 'out'}"
    assert bench_main(shlex.split(argv)) == 0
    (json_path,) = (tmp_path / "out").glob("step-*.json")
    assert len(list((tmp_path / "out").glob("step-*.png"))) == 1
    doc = json.loads(json_path.read_text())
    assert [p["batch_size"] for p in doc["points"]] == [1, 3]
    for point in doc["points"]:
        assert point["steps_timed"] == 4
        assert point["matmul_ms"] > 0 and point["attention_ms"] > 0
        parts = point["matmul_ms"] + point["attention_ms"] + point["rest_ms"]
        assert parts == pytest.approx(point["step_ms"], rel=0.05)  # medians of parts: close, not equal
        assert point["tokens_per_s"] == pytest.approx(1000 * point["batch_size"] / point["step_ms"])
        rate = 2 * doc["linear_weights"] * point["batch_size"] / (point["matmul_ms"] / 1000) / 1e9
        assert point["matmul_gops"] == pytest.approx(rate)
    peak = doc["compute_peak"]  # None only where the peak loops have no AVX2 to run
    assert peak is None or (peak["fp32_gflops"] > 0 and peak["int8_gops"] > 0 and peak["threads"] >= 1)


def test_batch_sizes_must_be_positive_whole_numbers():
    with pytest.raises(SystemExit):
        bench_main(["step", "--batch-sizes", "0,2"])
