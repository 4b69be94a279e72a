"""`bench attention` at tiny shapes: the JSON's structure, exact KV bytes per dtype, the verdicts, the LLC lookup."""

from __future__ import annotations

import json
import math
import shlex

import pytest

from bench.attention.bandwidth import FALLBACK_LLC_BYTES, last_level_cache, parse_size
from bench.cli import bench_main
from engine.native.attention import load_kernel
from engine.native.stream import load_stream_reader

NATIVE = load_kernel() is not None and load_stream_reader() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="no C compiler: the native kernels cannot be built here")
STREAM_BYTES = 1_000_000
# bytes of one token's K and V for one KV head (head_dim 64): values, and two fp16 scales for int8
TOKEN_HEAD_BYTES = {
    "bf16": 2 * 64 * 2,
    "fp32": 2 * 64 * 4,
    "fp16": 2 * 64 * 2,
    "int8": 2 * 64 + 2 * 2,
    "int8-bf16q": 2 * 64 + 2 * 2,
}
TARGETS = {"bf16": 0.70, "fp32": None, "fp16": None, "int8": 0.55, "int8-bf16q": 0.55}


@needs_native
def test_tiny_run_reports_every_kind_with_exact_bytes(tmp_path):
    out, copy = tmp_path / "out", tmp_path / "docs" / "attention.json"
    argv = (
        f"attention --seqs 4 --contexts 64,100 --min-time 0.01 --stream-bytes {STREAM_BYTES} "
        f"--results-dir {out} --json {copy}"
    )
    assert bench_main(shlex.split(argv)) == 0
    (json_path,) = out.glob("attention-*.json")
    assert len(list(out.glob("attention-*.png"))) == 1
    assert copy.read_text() == json_path.read_text()
    doc = json.loads(json_path.read_text())
    assert doc["shape"] == {
        "num_heads": 9,
        "num_kv_heads": 3,
        "head_dim": 64,
        "block_size": 16,
        "num_seqs": 4,
    }
    stream = doc["stream"]
    assert stream["buffer_bytes"] == STREAM_BYTES and stream["passes"] >= 5
    assert stream["best_gb_per_s"] >= stream["median_gb_per_s"] > 0
    assert stream["num_threads"] == doc["config"]["num_threads"]
    points = doc["points"]
    assert [(p["context_len"], p["kv"]) for p in points] == [
        (ctx, kv) for ctx in (64, 100) for kv in ("bf16", "fp32", "fp16", "int8", "int8-bf16q")
    ]
    for p in points:
        assert p["kv_bytes_per_call"] == 4 * p["context_len"] * 3 * TOKEN_HEAD_BYTES[p["kv"]]
        assert p["calls"] >= 5 and p["best_ms"] <= p["median_ms"]
        assert p["gb_per_s"] == pytest.approx(p["kv_bytes_per_call"] / (p["median_ms"] / 1000) / 1e9)
        assert p["gb_per_s"] > 0
        assert p["resident_gb_per_s"] == pytest.approx(
            p["kv_bytes_per_call"] / (p["resident_ms"] / 1000) / 1e9
        )
        assert p["fraction_of_stream"] == pytest.approx(p["gb_per_s"] / stream["median_gb_per_s"])
        assert p["target_fraction"] == TARGETS[p["kv"]]
        expected = None if p["target_fraction"] is None else p["fraction_of_stream"] >= p["target_fraction"]
        assert p["passed"] is expected
        if p["context_len"] == 64:  # whole blocks: each layer's pool holds exactly the bytes a call reads
            assert p["layers_rotated"] == math.ceil(STREAM_BYTES / p["kv_bytes_per_call"])
    assert {(p["kv"], p["q_dtype"], p["kv_dtype"]) for p in points} == {
        ("bf16", "bfloat16", "bfloat16"),
        ("fp32", "float32", "float32"),
        ("fp16", "float32", "float16"),
        ("int8", "float32", "int8"),
        ("int8-bf16q", "bfloat16", "int8"),
    }
    assert [(t["threshold"], t["passed"]) for t in doc["targets"]] == [
        (p["target_fraction"], p["passed"]) for p in points if p["target_fraction"] is not None
    ]


def test_without_native_code_exits_with_a_message(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGEDCHAT_NATIVE", "0")
    with pytest.raises(SystemExit, match="needs the native CPU kernels"):
        bench_main(["attention", "--results-dir", str(tmp_path)])


def test_unknown_kv_kind_is_rejected():
    with pytest.raises(SystemExit):
        bench_main(["attention", "--dtypes", "bf16,fp8"])


@pytest.mark.parametrize(
    ("text", "size"), [("32768K", 2**25), ("512K", 2**19), ("8M", 2**23), ("oops", None)]
)
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_last_level_cache_reads_level_3_or_falls_back(tmp_path):
    for name, level, size in (("index0", "1", "32K"), ("index3", "3", "16384K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert last_level_cache(tmp_path).num_bytes == 16 * 2**20
    fallback = last_level_cache(tmp_path / "missing")
    assert fallback.num_bytes == FALLBACK_LLC_BYTES and "assumed 32 MiB" in fallback.source
