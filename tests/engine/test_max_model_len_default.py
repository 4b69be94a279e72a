"""max_model_len left unset (#39 item 2): the model's own limit where the KV pool holds one such sequence, else the
longest the pool holds, said in one start-up line naming the flags; a length the user sets is held or refused."""

from __future__ import annotations

import logging

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.engine.bench_helpers import make_tiny_model_folder

BLOCK_BYTES = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x kv_heads x head_dim x block tokens x fp32
MODEL_LIMIT = 8192  # the model's max_position_embeddings, over the old default's 4,096 cap


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-8k")
    return str(make_tiny_model_folder(path, max_position_embeddings=MODEL_LIMIT))


def engine(model_dir: str, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model_dir, dtype="float32", device="cpu", num_threads=1, **overrides))


def test_unset_max_model_len_is_the_models_own_limit_where_the_pool_holds_it(model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.llm_engine"):
        llm = engine(model_dir, kv_cache_bytes=MODEL_LIMIT // 16 * BLOCK_BYTES)
    assert llm.config.max_model_len == MODEL_LIMIT
    assert not [r for r in caplog.records if "max_model_len" in r.getMessage()]
    # a prompt of 5,000 tokens (a long pasted document) is accepted
    llm.add_request("doc", [5] * 5000, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    llm.abort_request("doc")


def test_a_pool_that_cannot_hold_the_model_limit_shortens_it_and_says_so(model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="engine.llm_engine"):
        llm = engine(model_dir, kv_cache_bytes=100 * BLOCK_BYTES)  # 1,600 tokens
    assert llm.config.max_model_len == 1600
    lines = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert lines == [
        "max_model_len 1600, not the model's 8192: the KV pool (819 kB) holds 1600 tokens; --max-model-len and "
        "--kv-cache-bytes change it"
    ]
    with pytest.raises(ValueError, match=r"exceeds max_model_len \(1600\): shorten the prompt"):
        llm.add_request("long", [5] * 1600, SamplingParams(max_tokens=1))


def test_a_max_model_len_the_user_sets_is_kept_or_refused_naming_the_flags(model_dir):
    assert (
        engine(model_dir, max_model_len=4096, kv_cache_bytes=256 * BLOCK_BYTES).config.max_model_len == 4096
    )
    with pytest.raises(ValueError) as info:
        engine(model_dir, max_model_len=4096, kv_cache_bytes=100 * BLOCK_BYTES)
    assert str(info.value) == (
        "the KV pool holds 1600 tokens (100 blocks of 16), less than one max_model_len sequence (4096): raise "
        "--kv-cache-bytes (GPU: --memory-utilization) or lower --max-model-len"
    )
