"""`bench quality` end to end on a tiny random GGUF model: every mode against the fp32 reference, JSON and PNG."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main
from bench.quality import command as quality_command
from bench.quality.command import MODES, REFERENCE, TEXT_FILE, agreement, logprob_delta, perplexity
from engine.native.quant_linear import load_kernel
from tests.engine.gguf_factories import write_tiny_chat_gguf


def test_agreement_and_deltas_on_known_values():
    ref, got = [[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]
    assert agreement(ref, got) == {
        "prefix_agreement": 0.75,
        "overall_agreement": 5 / 6,
        "identical_outputs": 1,
    }
    assert logprob_delta([[-1.0, -2.0]], [[-1.5, -2.0]]) == {
        "mean_abs_dlogprob": 0.25,
        "max_abs_dlogprob": 0.5,
    }
    assert perplexity([-1.0, -1.0]) == pytest.approx(2.718281828)


def test_quality_bench_compares_every_mode_with_the_reference(tmp_path, capsys, monkeypatch):
    # the default pool (256 MiB, for SmolLM2) zeroed and indexed in each of the 14 modes was a third of the test's
    # time; the tiny model's 3 prompts and 256-token text need a few blocks
    monkeypatch.setattr(quality_command, "DEFAULT_KV_CACHE_BYTES", 4 * 2**20)
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=5)
    argv = f"quality --model {model} --max-tokens 6 --num-prompts 3 --results-dir {tmp_path / 'out'}"
    assert bench_main(shlex.split(argv)) == 0
    (json_path,) = (tmp_path / "out").glob("quality-*.json")
    assert len(list((tmp_path / "out").glob("quality-*.png"))) == 1
    doc = json.loads(json_path.read_text())
    modes = doc["modes"]
    assert list(modes) == list(MODES) and doc["skipped"] == {}
    assert doc["workload"]["text_tokens"] == 256  # the text is cut to the tiny model's context
    reference, exact, fast = modes[REFERENCE], modes["gguf"], modes["gguf-int8act"]
    assert reference["quantization"] == "none" and exact["quantization"] == fast["quantization"] == "gguf"
    assert reference["prefix_agreement"] == 1.0 and reference["mean_abs_dlogprob"] == 0.0
    assert all(len(tokens) == 6 for tokens in doc["greedy_tokens"]["gguf"])
    assert exact["mean_abs_dlogprob"] < 1e-3 and doc["targets"][0]["passed"]
    assert exact["perplexity"] == pytest.approx(reference["perplexity"], rel=1e-3)
    if load_kernel() is not None:  # without the compiled kernel the torch twin keeps activations in fp32
        assert fast["mean_abs_dlogprob"] > exact["mean_abs_dlogprob"]
    out = capsys.readouterr().out
    assert "gguf-int8act" in out and "gguf-int8kv vs gguf (the int8 KV cache alone)" in out
    assert modes["gguf-int8kv"]["kv_cache_dtype"] == "int8" and exact["kv_cache_dtype"] == "float32"
    assert modes["none-bf16"]["dtype"] == "bfloat16" and modes["none-bf16-int8kv"]["kv_cache_dtype"] == "int8"
    assert "gguf-fp16kv vs gguf (the float16 KV cache alone)" in out
    assert modes["gguf-int8-fp16kv"]["kv_cache_dtype"] == "float16"
    pairs = doc["rounded_kv_vs_model_dtype_kv"]
    assert {name: p["against"] for name, p in pairs.items()} == {
        "none-fp32-int8kv": REFERENCE,
        "gguf-int8kv": "gguf",
        "gguf-int8-int8kv": "gguf-int8",
        "none-bf16-int8kv": "none-bf16",
        "none-fp32-fp16kv": REFERENCE,
        "gguf-fp16kv": "gguf",
        "gguf-int8-fp16kv": "gguf-int8",
    }
    assert 0 < pairs["none-fp32-int8kv"]["mean_abs_dlogprob"] < 0.5  # rounded KV: small, never zero
    # fp16 keeps 11 bits of each value where int8 keeps ~7: its own effect is far smaller
    assert pairs["none-fp32-fp16kv"]["mean_abs_dlogprob"] < pairs["none-fp32-int8kv"]["mean_abs_dlogprob"] / 4


def test_quality_modes_select_their_reference_and_twins():
    from bench.quality.command import _selected_modes

    assert _selected_modes("gguf-int8kv") == [REFERENCE, "gguf", "gguf-int8kv"]
    # int8 activations and the int8 KV cache: its float-KV twin is the int8-activation mode
    assert _selected_modes("gguf-int8-int8kv") == [REFERENCE, "gguf-int8", "gguf-int8-int8kv"]
    assert _selected_modes("none-bf16, gguf") == [REFERENCE, "gguf", "none-bf16"]
    assert _selected_modes("gguf-int8-fp16kv") == [REFERENCE, "gguf-int8", "gguf-int8-fp16kv"]
    with pytest.raises(SystemExit, match="unknown quality modes"):
        _selected_modes("gguf,fp8")


def test_the_perplexity_text_ships_with_the_benchmarks():
    assert TEXT_FILE.is_file() and TEXT_FILE.read_text(encoding="utf-8").startswith("It is a truth")
