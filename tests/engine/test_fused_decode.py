"""The fused decode step (engine/models/fused_decode.py + engine/native/decode_step.c): the same kernels as the
module path in the same order, so tokens and logprobs are equal bit for bit; it runs only where it applies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import fused_decode
from engine.models.fused_decode import FusedDecoder
from engine.models.quantized import QuantEmbedding, QuantType
from engine.native.quant_linear import GEMV_MAX_ROWS
from tests.engine.factories import make_attention_metadata
from tests.engine.gguf_factories import T, write_q4km_like_gguf, write_tiny_chat_gguf

KV_BYTES = 8 * 2**20
PROMPTS = [f"prompt number {i}: tell me about {word}" for i, word in enumerate("abcdefghijklmnopqrstuvwx")]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_chat_gguf(tmp_path_factory.mktemp("fused") / "tiny.gguf", seed=11, num_layers=3)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Path:
    """Q4_K_M's mix in small (layer 1's k Q5_K: three formats in one qkv), a tied Q6_K embedding."""
    path = tmp_path_factory.mktemp("fused") / "mixed.gguf"
    return write_q4km_like_gguf(path, seed=5, embed_type=T.Q6_K, extra={"blk.1.attn_k.weight": T.Q5_K})


def _run(
    model: Path,
    fused: bool,
    prompts: list[str],
    act_q8: bool = False,
    kv_cache_dtype: str = "auto",
    batch_gemm: str = "int8",
    params: SamplingParams | None = None,
    weight_layout: str = "auto",
):
    llm = LLM(
        model=str(model),
        quantization="gguf",
        int8_activations=act_q8,
        fused_decode=fused,
        kv_cache_bytes=KV_BYTES,
        kv_cache_dtype=kv_cache_dtype,
        batch_gemm=batch_gemm,
        weight_layout=weight_layout,
    )
    params = params or SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    return llm, [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize(
    ("act_q8", "kv_cache_dtype"),
    [(False, "auto"), (True, "auto"), (False, "int8"), (True, "float16")],
    ids=["fp32", "q8acts", "int8kv", "fp16kv"],
)
@pytest.mark.parametrize("num_prompts", [1, 5, GEMV_MAX_ROWS + 1])  # past 16 sequences: the int8 batch GEMM
def test_fused_step_equals_the_module_path_bit_for_bit(
    monkeypatch, tiny_gguf, act_q8, kv_cache_dtype, num_prompts
):
    rows = []
    original = FusedDecoder.decode  # what a decode step calls (`forward` is its tensor twin)
    monkeypatch.setattr(
        FusedDecoder,
        "decode",
        lambda self, ids, *a, **k: rows.append(len(ids)) or original(self, ids, *a, **k),
    )
    llm, fused = _run(tiny_gguf, True, PROMPTS[:num_prompts], act_q8, kv_cache_dtype)
    assert llm.engine.runner.fused is not None and rows, "the fused step should have run"
    assert max(rows) == num_prompts, (
        "every decode step, the batch GEMM's ones too, should reach the fused step"
    )
    # auto: fp16 under int8 activations (engine/core/resolve.py), else the model's fp32
    pool = {"int8": torch.int8, "float16": torch.float16}.get(
        kv_cache_dtype, torch.float16 if act_q8 else torch.float32
    )
    assert llm.engine.runner.kv_cache.dtype == pool
    _, modules = _run(tiny_gguf, False, PROMPTS[:num_prompts], act_q8, kv_cache_dtype)
    assert fused == modules  # tokens and logprobs, exactly


@pytest.mark.parametrize(
    ("act_q8", "num_prompts"),
    [(False, 1), (True, 5), (True, GEMV_MAX_ROWS + 1)],
    ids=["fp32-1", "q8-5", "q8-gemm"],
)
def test_a_model_of_mixed_formats_is_fused_bit_for_bit(mixed_gguf, act_q8, num_prompts):
    """Segments of several formats in one linear and the embedding gathered from its blocks: the C step calls what
    the modules call, per segment into the same columns."""
    layout = (
        "rows8" if act_q8 else "file"
    )  # int8 activations: Q4_K repacked (auto does so on AVX512-VNNI CPUs)
    llm, fused = _run(mixed_gguf, True, PROMPTS[:num_prompts], act_q8, weight_layout=layout)
    model = llm.engine.runner.model
    assert llm.engine.runner.fused is not None, "the fused step should take a model of mixed formats"
    q4 = QuantType.Q4_K_R8 if act_q8 else T.Q4_K
    assert model.layers[0].self_attn.qkv_proj.qtypes == (q4, T.Q6_K)
    assert model.layers[1].self_attn.qkv_proj.qtypes == (q4, T.Q5_K, T.Q6_K)
    assert isinstance(model.embed_tokens, QuantEmbedding)
    assert model.lm_head.blocks.data_ptr() == model.embed_tokens.blocks.data_ptr()  # one copy of the bytes
    _, modules = _run(mixed_gguf, False, PROMPTS[:num_prompts], act_q8, weight_layout=layout)
    assert fused == modules and len(fused[0][0]) == 12


def test_past_the_gemv_bound_a_batch_gemm_in_torch_leaves_the_step_to_the_modules(monkeypatch, tiny_gguf):
    """batch_gemm fp32 multiplies more than 16 rows in torch (dequantized tiles): the fused step stops at 16."""
    prompts = PROMPTS[: GEMV_MAX_ROWS + 4]
    llm, fused = _run(tiny_gguf, True, prompts, batch_gemm="fp32")
    assert llm.engine.runner.fused.max_rows == GEMV_MAX_ROWS
    assert fused == _run(tiny_gguf, False, prompts, batch_gemm="fp32")[1]


def test_fused_step_is_off_where_it_does_not_apply(tiny_gguf, caplog):
    dense = LLM(model=str(tiny_gguf), quantization="none", dtype="float32", kv_cache_bytes=KV_BYTES)
    assert dense.engine.runner.fused is None
    assert fused_decode._unsupported(dense.engine.runner.model, dense.engine.runner.kv_caches) == (
        "its layer linears are not GGUF blocks (it needs --quantization gguf)"
    )
    off = LLM(model=str(tiny_gguf), quantization="gguf", fused_decode=False, kv_cache_bytes=KV_BYTES)
    assert off.engine.runner.fused is None


def test_a_block_past_the_pool_is_refused_before_c_follows_it(tiny_gguf):
    llm = LLM(model=str(tiny_gguf), quantization="gguf", kv_cache_bytes=KV_BYTES)
    runner = llm.engine.runner
    with pytest.raises(RuntimeError, match="past a pool of"):
        runner.fused.decode([1], [2], [[runner.num_blocks]])


def test_a_token_past_the_vocabulary_is_refused_before_c_reads_its_embedding(tiny_gguf):
    llm = LLM(model=str(tiny_gguf), quantization="gguf", kv_cache_bytes=KV_BYTES)
    runner = llm.engine.runner
    vocab = runner.model.args.vocab_size
    for token in (vocab, -1):
        with pytest.raises(RuntimeError, match="decode_layers failed"):
            runner.fused.decode([token], [2], [[0]])


def test_one_step_equals_the_module_path_and_refuses_what_it_cannot_take(tiny_gguf):
    llm = LLM(model=str(tiny_gguf), quantization="gguf", kv_cache_bytes=KV_BYTES)
    runner = llm.engine.runner
    fused, bs = runner.fused, runner.spec.block_size
    tables = [[3, 5], [7], [1, 2, 4]]
    positions = [bs + 2, 5, 2 * bs + 9]  # each sequence's new token, inside its last block
    token_ids = [11, 22, 33]
    seq_lens = [p + 1 for p in positions]
    # fill the pool's earlier slots with something, so attention reads real values
    runner.kv_cache.normal_(generator=torch.Generator().manual_seed(2))
    snapshot = runner.kv_cache.clone()
    meta = make_attention_metadata([1, 1, 1], seq_lens, tables, bs)
    runner.backend.prepare(meta)
    with torch.inference_mode():  # the per-module path on the same step: hidden states and the KV it stores
        expected = runner.model(
            torch.tensor(token_ids), torch.tensor(positions), runner.kv_caches, meta, runner.backend
        )
    stored = runner.kv_cache.clone()
    runner.kv_cache.copy_(snapshot)
    got = fused.decode(token_ids, positions, tables)
    assert torch.equal(got.hidden, expected) and torch.equal(runner.kv_cache, stored)
    # the LM head and greedy's argmax ran in the same call: the module head's logits, torch's argmax
    # up to the GEMV bound, whichever batch GEMM this CPU picks
    assert fused.head_rows == GEMV_MAX_ROWS
    with torch.inference_mode():
        logits = runner.model.compute_logits(expected)
    assert torch.equal(got.logits, logits) and got.argmax == logits.argmax(-1).tolist()
    runner.kv_cache.copy_(snapshot)
    without = fused.decode(token_ids, positions, tables, logits=False)
    assert torch.equal(without.hidden, expected) and without.logits is None and without.argmax is None
    # more sequences than the fused step takes, or a table wider than the buffers: not taken (None)
    assert (
        fused.decode([1] * (fused.max_rows + 1), [0] * (fused.max_rows + 1), [[0]] * (fused.max_rows + 1))
        is None
    )
    wide = list(range(fused._inputs.width + 1))
    assert fused.decode([1], [0], [wide]) is None


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=10, ignore_eos=True, logprobs=2),
    ],
    ids=["greedy", "penalised", "sampled"],
)
def test_the_fused_head_and_argmax_serve_greedy_and_step_aside_for_the_rest(monkeypatch, tiny_gguf, params):
    """Greedy rows take the step's own argmax; a penalty changes the logits first and a sampled row draws from
    them, so those rows must not: every mode gives the module path's tokens (and logprobs)."""
    heads = []
    original = FusedDecoder.decode

    def decode(self, *args, **kwargs):
        got = original(self, *args, **kwargs)
        heads.append(got.logits is not None)
        return got

    monkeypatch.setattr(FusedDecoder, "decode", decode)
    prompts = PROMPTS[:3]
    _, fused = _run(tiny_gguf, True, prompts, params=params)
    assert heads and all(heads), "every decode step of 3 sampling sequences should run the head in C"
    _, modules = _run(tiny_gguf, False, prompts, params=params)
    assert fused == modules
