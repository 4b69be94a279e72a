"""GGUF files of the Llama family (Qwen2, Mistral, Llama 3 with rope_freqs) and the K-quant formats: the loaded
model gives the logits of the transformers model holding the same weights; tensors equal gguf.quants.dequantize."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.loading.gguf import gguf_hf_config, iter_gguf_tensors, load_gguf_model, open_gguf
from engine.models.llama import Linear, ModelArgs
from engine.models.quantized import QuantLinear, dequantize_torch
from engine.models.rope import rope_inv_freq
from tests.engine.factories import make_hf_model
from tests.engine.gguf_factories import T, teacher_forced_logits
from tests.engine.gguf_from_hf import K_TYPES, WIDE, write_hf_model_gguf

CPU = torch.device("cpu")
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # kind -> (HF config overrides, file formats)
    # a Q4_K_M-like mix: Q4_K linears, some Q6_K/Q5_K, a Q6_K embedding that the tied head shares
    "qwen2": (
        dict(tie_word_embeddings=True),
        dict(
            linear_type=T.Q4_K,
            embed_type=T.Q6_K,
            type_overrides={"blk.1.attn_v.weight": T.Q6_K, "blk.0.ffn_down.weight": T.Q5_K},
        ),
    ),
    "mistral": (dict(tie_word_embeddings=False), dict(linear_type=T.Q8_0, head_type=T.Q6_K)),
    "llama3": (
        dict(tie_word_embeddings=False),
        dict(linear_type=T.Q3_K, embed_type=T.Q2_K, head_type=T.Q5_K),
    ),
}


def make_case(tmp_path: Path, kind: str, seed: int = 0) -> tuple[Any, Path, dict[str, T]]:
    """The HF model and its GGUF file (the model now holds the file's weights) and each tensor's format."""
    config_overrides, formats = CASES[kind]
    hf_model = make_hf_model(kind, seed=seed, **WIDE, **config_overrides)
    path = tmp_path / f"{kind}.gguf"
    kinds = write_hf_model_gguf(path, hf_model, seed=seed, **formats)
    return hf_model, path, kinds


def hf_logits(hf_model: Any, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("kind", sorted(CASES))
def test_metadata_maps_to_the_hf_config(tmp_path, kind):
    hf_model, path, _ = make_case(tmp_path, kind)
    config = gguf_hf_config(open_gguf(path))
    assert config.model_type == ("qwen2" if kind == "qwen2" else "llama")
    got, expected = ModelArgs.from_hf_config(config), ModelArgs.from_hf_config(hf_model.config)
    assert (got.qkv_bias, got.o_bias, got.tie_word_embeddings) == (kind == "qwen2", False, kind == "qwen2")
    if kind == "llama3":  # the scaling arrives as llama.cpp's per-frequency divisors, not HF's parameters
        assert got.rope_type == "default" and len(got.rope_freq_factors) == WIDE["head_dim"] // 2
        torch.testing.assert_close(rope_inv_freq(got), rope_inv_freq(expected), rtol=1e-6, atol=0)
        assert not torch.allclose(rope_inv_freq(got), rope_inv_freq(replace(got, rope_freq_factors=())))
        got = replace(got, rope_freq_factors=(), rope_type="llama3", rope_scaling=expected.rope_scaling)
    assert got.rms_norm_eps == pytest.approx(expected.rms_norm_eps, rel=1e-7)  # stored as fp32
    assert replace(got, rms_norm_eps=expected.rms_norm_eps) == expected


@pytest.mark.parametrize("kind", sorted(CASES))
def test_tensors_equal_gguf_dequantize_in_hf_order(tmp_path, kind):
    """Every weight, read and q/k un-permuted (llama) or not (qwen2), equals gguf.quants.dequantize of its blocks,
    which write_hf_model_gguf put into the HF model (K formats: random blocks)."""
    hf_model, path, kinds = make_case(tmp_path, kind)
    reader = open_gguf(path)
    tensors = dict(iter_gguf_tensors(reader, gguf_hf_config(reader), torch.float32))
    expected = dict(hf_model.named_parameters())
    assert set(tensors) == set(expected)
    assert set(kinds.values()) >= {k for k in K_TYPES if k in CASES[kind][1].values()}
    for name, value in tensors.items():
        got = value if isinstance(value, torch.Tensor) else dequantize_torch(value)
        assert torch.equal(got, expected[name].detach()), name


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("quantization", ["gguf", "none"])
def test_logits_match_transformers(tmp_path, caplog, kind, quantization):
    """Prefill then decode steps over the paged cache give the transformers model's logits (same weights)."""
    hf_model, path, kinds = make_case(tmp_path, kind, seed=1)
    with caplog.at_level(logging.INFO, logger="engine.loading.gguf"):
        model, _ = load_gguf_model(path, torch.float32, CPU, quantization=quantization)
    tokens = torch.randint(0, 128, (28,), generator=torch.Generator().manual_seed(2)).tolist()
    expected = hf_logits(hf_model, tokens)
    assert expected.std() > 0.5, "random weights should give well-spread logits"
    torch.testing.assert_close(
        teacher_forced_logits(model, tokens, prefill_len=20), expected, atol=2e-4, rtol=0
    )
    # every format here but Q2_K (llama3's embedding, no linear) has a block kernel: with quantization gguf the
    # linears stay in blocks (layer 0's q/k/v share one format in every case)
    in_blocks = quantization == "gguf"
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) if in_blocks else type(qkv) is Linear
    assert (qkv.bias is not None) == (kind == "qwen2")
    for kind_name in {k.name for k in kinds.values()}:
        assert f"GGUF {kind_name}: " in caplog.text
    num_q4_k = sum(k == T.Q4_K for k in kinds.values())
    if kind == "qwen2" and quantization == "none":
        assert f"GGUF Q4_K: 0 tensors kept in blocks, {num_q4_k} loaded as torch.float32" in caplog.text


def test_llama3_logits_depend_on_rope_freqs(tmp_path):
    """The llama3 case would catch a loader that dropped rope_freqs: default RoPE gives other logits."""
    hf_model, path, _ = make_case(tmp_path, "llama3", seed=1)
    model, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    tokens = list(range(3, 31))
    model.args, scaled_cache = replace(model.args, rope_freq_factors=()), model.rope_cache
    model.retie_and_rebuild_rope()
    assert not torch.equal(model.rope_cache, scaled_cache)
    gap = (teacher_forced_logits(model, tokens, 20) - hf_logits(hf_model, tokens)).abs().max()
    assert gap > 1e-2, f"default RoPE gave the llama3 logits (max gap {gap})"
