"""`bench make-gguf` on the tiny shapes: the file holds what llama.cpp's converter would write (types by
llama-quantize's rules, metadata, a tokenizer of exactly the vocabulary size), its blocks dequantize to small finite
weights, and transformers and our engine load it and generate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, quants

from bench.cli import bench_main
from bench.make_gguf.blocks import SCALE_FIELDS, random_blocks, random_chunks, tensor_nbytes
from bench.make_gguf.shapes import SHAPES, rope_freq_factors
from bench.make_gguf.tensor_types import tensor_plan
from engine.loading.gguf import load_gguf_tokenizer, open_gguf
from engine.loading.gguf_config import gguf_field, gguf_hf_config

T = GGMLQuantizationType


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """The tiny llama in Q4_K_M and the tiny qwen2 in Q5_K_M, written through the CLI."""
    out = tmp_path_factory.mktemp("make-gguf")
    files = {}
    for shape, kind in (("tiny", "Q4_K_M"), ("tiny-qwen2", "Q5_K_M")):
        files[shape] = out / f"{shape}.{kind}.gguf"
        assert bench_main(["make-gguf", "--shape", shape, "--type", kind, "--out", str(files[shape])]) == 0
    return files


@pytest.mark.parametrize(("shape", "file_type", "arch"), [("tiny", 15, "llama"), ("tiny-qwen2", 17, "qwen2")])
def test_file_is_laid_out_as_planned(tiny_files, shape, file_type, arch):
    reader = GGUFReader(tiny_files[shape])
    plan = tensor_plan(SHAPES[shape], "Q4_K_M" if file_type == 15 else "Q5_K_M")
    assert [(t.name, t.tensor_type) for t in reader.tensors] == [(s.name, s.type) for s in plan]
    for tensor, spec in zip(reader.tensors, plan, strict=True):
        assert tuple(int(d) for d in reversed(tensor.shape.tolist())) == spec.shape
        assert tensor.n_bytes == tensor_nbytes(spec.type, spec.shape)
    meta = open_gguf(
        tiny_files[shape]
    )  # the metadata as the engine reads it (gguf-py reads the tensors above)
    assert gguf_field(meta, "general.architecture") == arch
    assert gguf_field(meta, "general.file_type") == file_type
    assert gguf_field(meta, f"{arch}.block_count") == SHAPES[shape].num_layers
    assert gguf_field(meta, "tokenizer.ggml.model") == "gpt2"
    tokens = gguf_field(meta, "tokenizer.ggml.tokens")
    assert len(tokens) == len(set(tokens)) == SHAPES[shape].vocab_size
    merges = gguf_field(meta, "tokenizer.ggml.merges")
    known = set(tokens)
    assert all(a in known and b in known and a + b in known for a, b in (m.split(" ") for m in merges))
    config = gguf_hf_config(meta)
    assert (config.vocab_size, config.hidden_size, config.num_key_value_heads) == (
        SHAPES[shape].vocab_size,
        512,
        2 if arch == "qwen2" else 4,
    )
    assert config.tie_word_embeddings


def test_blocks_dequantize_to_small_finite_weights(tiny_files):
    reader = GGUFReader(tiny_files["tiny"])
    seen = set()
    for tensor in reader.tensors:
        if tensor.tensor_type in seen or tensor.tensor_type == T.F32:
            continue
        seen.add(tensor.tensor_type)
        weights = quants.dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(weights).all(), tensor.name
        assert 5e-3 < np.abs(weights).mean() < 0.05, (tensor.name, np.abs(weights).mean())
    assert seen == {T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0}


@pytest.mark.parametrize("kind", sorted(SCALE_FIELDS, key=int), ids=lambda kind: kind.name)
def test_every_block_type_has_finite_scales(kind):
    blocks = random_blocks(kind, 64, np.random.default_rng(0))
    weights = quants.dequantize(blocks, kind)
    assert weights.size == 64 * GGML_QUANT_SIZES[kind][0]
    assert np.isfinite(weights).all() and 5e-3 < np.abs(weights).mean() < 0.05


def test_chunks_are_whole_rows_and_add_up():
    chunks = list(random_chunks(T.Q4_K, (10, 512), np.random.default_rng(0), chunk_bytes=3 * 288))
    assert [c.nbytes for c in chunks] == [3 * 288] * 3 + [288]  # a 512-wide Q4_K row is two 144-byte blocks


def test_rope_freqs_equal_transformers_llama3_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import _compute_llama3_parameters

    shape = SHAPES["llama-3.2-1b"]
    scaling = shape.rope_scaling
    config = LlamaConfig(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        max_position_embeddings=shape.context_length,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": shape.rope_theta, "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position,
        },
    )  # fmt: skip
    inv_freq, _ = _compute_llama3_parameters(config)
    base = 1.0 / shape.rope_theta ** (
        torch.arange(0, shape.head_dim, 2, dtype=torch.float64) / shape.head_dim
    )
    torch.testing.assert_close(
        base / torch.tensor(rope_freq_factors(shape), dtype=torch.float64), inv_freq.double()
    )


@pytest.mark.parametrize(
    ("shape", "bos", "eos", "first_chat_tokens"),
    [
        ("tiny", "<|begin_of_text|>", "<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "user"]),
        ("tiny-qwen2", "<|endoftext|>", "<|im_end|>", ["<|im_start|>", "system", "Ċ"]),
    ],
)
def test_transformers_reads_the_tokenizer(tiny_files, shape, bos, eos, first_chat_tokens):
    tokenizer = load_gguf_tokenizer(tiny_files[shape])
    vocab = tokenizer.get_vocab()
    # transformers' GPT2Tokenizer adds its default <|endoftext|> where the vocabulary has none (as for any Llama 3)
    assert len(vocab) == SHAPES[shape].vocab_size + (shape == "tiny")
    assert (tokenizer.bos_token, tokenizer.eos_token) == (bos, eos)
    text = "It is a truth universally acknowledged, that a single man in possession of a good fortune."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2.5  # learned merges: mostly whole words, not bytes
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    chat = chat["input_ids"] if hasattr(chat, "keys") else chat
    assert tokenizer.convert_ids_to_tokens(chat[:3]) == first_chat_tokens


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen2"])
def test_engine_generates_from_the_file(tiny_files, shape):
    from engine import LLM, SamplingParams

    llm = LLM(model=str(tiny_files[shape]), kv_cache_bytes=2**22, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (output,) = llm.chat([[{"role": "user", "content": "Hello there"}]], params)
    token_ids = output.outputs[0].token_ids
    assert len(token_ids) == 6 and all(0 <= t < SHAPES[shape].vocab_size for t in token_ids)
