"""`bench prefill` on a tiny random GGUF model: every prompt token computed in each pass, parts that add up to the
best pass, the layer linears' rate from the weights of every linear but the LM head."""

from __future__ import annotations

import json
import shlex

import pytest

from bench.cli import bench_main
from bench.common.workload import chat_requests
from engine import LLM
from engine.models.quantized import linear_modules
from tests.bench.fake_openai import LLAMA_TIMINGS, fake_server
from tests.engine.gguf_factories import write_tiny_chat_gguf


def test_prefill_rate_of_the_serving_prompts(tmp_path):
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=3, context_length=4096)
    argv = f"prefill --model {model} --kv-cache-bytes {2**24} --num-requests 3 --repeats 2 --results-dir {tmp_path / 'out'}"
    assert bench_main(shlex.split(argv)) == 0
    (json_path,) = (tmp_path / "out").glob("prefill-*.json")
    assert len(list((tmp_path / "out").glob("prefill-*.png"))) == 1
    doc = json.loads(json_path.read_text())

    engine = LLM(model=str(model), kv_cache_bytes=2**24, kv_disk_bytes=0).engine  # a pool the prompts fit
    prompts = [engine.apply_chat_template(r.messages) for r in chat_requests(3)]
    assert doc["workload"]["prompt_tokens"] == sum(len(p) for p in prompts)
    model_ = engine.runner.model
    weights = sum(m.in_features * m.out_features for m in linear_modules(model_) if m is not model_.lm_head)
    assert doc["layer_linear_weights"] == weights
    assert len(doc["passes"]) == 2
    best = doc["best"]
    assert best["seconds"] == min(p["seconds"] for p in doc["passes"])
    assert best["matmul_s"] > 0 and best["attention_s"] > 0
    assert best["matmul_s"] + best["attention_s"] + best["rest_s"] == pytest.approx(best["seconds"])
    assert best["tokens_per_s"] == pytest.approx(doc["workload"]["prompt_tokens"] / best["seconds"])
    rate = 2 * weights * doc["workload"]["prompt_tokens"] / best["matmul_s"] / 1e9
    assert best["layer_linears_gop_per_s"] == pytest.approx(rate)
    assert doc["config"]["threads"] >= 1


def test_prefill_needs_a_request_and_a_pass(tmp_path):
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=3, context_length=4096)
    with pytest.raises(SystemExit, match="--num-requests and --repeats must be at least 1, got 0, 3"):
        bench_main(shlex.split(f"prefill --model {model} --num-requests 0 --results-dir {tmp_path}"))


def test_prefill_of_one_long_prompt_beside_a_llama_cpp_baseline(tmp_path):
    """--prompt-tokens: one prompt of exactly that many tokens; --baseline-url: the same ids go to llama.cpp's
    /completion (one token, its prompt cache off) once to warm up and once per repeat, and its rate comes from its
    own timings."""
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=3, context_length=4096)
    with fake_server("tiny.gguf", "llamacpp", LLAMA_TIMINGS) as (url, theirs):
        argv = (
            f"prefill --model {model} --kv-cache-bytes {2**24} --max-model-len 1024 --prompt-tokens 600 "
            f"--repeats 2 --baseline-url {url} --results-dir {tmp_path / 'out'}"
        )
        assert bench_main(shlex.split(argv)) == 0
    (json_path,) = (tmp_path / "out").glob("prefill-*.json")
    doc = json.loads(json_path.read_text())
    assert doc["workload"]["prompt_tokens"] == 600 and doc["workload"]["num_requests"] == 1
    assert len(theirs.prompts_asked) == 3 and all(p == theirs.prompts_asked[0] for p in theirs.prompts_asked)
    assert len(theirs.prompts_asked[0]) == 600 and all(isinstance(t, int) for t in theirs.prompts_asked[0])
    baseline = doc["baseline"]
    assert baseline["name"] == "llama.cpp" and baseline["passes_ms"] == [300.0, 300.0]
    assert baseline["tokens_per_s"] == pytest.approx(2000.0)  # the fake's 0.5 ms a token
    assert doc["ratio_tokens_per_s"] == pytest.approx(doc["best"]["tokens_per_s"] / 2000.0)


def test_prefill_baseline_needs_one_long_prompt(tmp_path):
    model = write_tiny_chat_gguf(tmp_path / "tiny.gguf", seed=3, context_length=4096)
    with pytest.raises(SystemExit, match="--baseline-url needs --prompt-tokens"):
        bench_main(
            shlex.split(f"prefill --model {model} --baseline-url http://127.0.0.1:9 --results-dir {tmp_path}")
        )
