"""GGUF loading without a float copy: the header parsed by gguf_file.py, blocks read straight into one buffer per fused
linear (never through the memory map), formats without a block kernel loaded only with a warning stating their cost
or refused when they would not fit, the tokenizer built without AutoTokenizer's slow config parse, the memory line."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.core.memory import human_bytes
from engine.loading import gguf_weights, tokenizer_cache
from engine.loading.gguf import (
    gguf_hf_config,
    iter_gguf_tensors,
    load_gguf_model,
    load_gguf_tokenizer,
    open_gguf,
)
from engine.loading.gguf_weights import NotEnoughMemory
from engine.loading.memory import weight_memory
from engine.models.llama import Linear
from engine.models.quantized import QuantEmbedding, QuantLinear, QuantWeight
from tests.engine.factories import make_hf_model
from tests.engine.gguf_factories import (
    T,
    TinyLlama,
    teacher_forced_logits,
    write_tiny_chat_gguf,
    write_tiny_gguf,
)
from tests.engine.gguf_from_hf import WIDE, make_chat_gguf, write_hf_model_gguf

CPU = torch.device("cpu")


def test_header_parse_equals_gguf_reader(tmp_path):
    """Every metadata value (the tokenizer's string arrays included) and every tensor's place equal GGUFReader's."""
    path = write_tiny_chat_gguf(tmp_path / "chat.gguf", linear_type=T.Q4_0)
    ours, reference = open_gguf(path), gguf.GGUFReader(path)
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]
    assert sorted(ours.metadata) == sorted(keys) and "tokenizer.ggml.merges" in keys
    for key in keys:
        value, expected = ours.value(key), reference.fields[key].contents()
        assert value == pytest.approx(expected) if isinstance(expected, float) else value == expected, key
    assert len(ours.tensors) == len(reference.tensors)
    for got, want in zip(ours.tensors, reference.tensors, strict=True):
        assert (got.name, got.tensor_type, got.shape.tolist(), got.n_bytes, got.data_offset) == (
            want.name,
            want.tensor_type,
            want.shape.tolist(),
            want.n_bytes,
            want.data_offset,
        )
        assert np.array_equal(got.data, want.data) and got.data.dtype == want.data.dtype, got.name
    with pytest.raises(ValueError, match="not a GGUF file"):
        open_gguf(Path(tmp_path / "other.gguf").write_bytes(b"GGML" + bytes(60)) and tmp_path / "other.gguf")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_files_tokenizer_is_built_once_then_read_back_the_same(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path / "cache"))
    _, path = make_chat_gguf(tmp_path / f"{kind}.gguf", kind)
    built = load_gguf_tokenizer(path)
    kept = tokenizer_cache.tokenizer_file(path.resolve())
    assert kept.is_file()
    with monkeypatch.context() as patched:  # a second load must not build: transformers' GGUF path would fail
        patched.setattr(tempfile, "TemporaryDirectory", None)
        saved = load_gguf_tokenizer(path)
    assert type(saved) is type(built)
    assert saved.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo <b> 12\n\n x"}]
    assert saved.encode(messages[1]["content"]) == built.encode(messages[1]["content"])
    assert saved.apply_chat_template(messages, tokenize=False) == built.apply_chat_template(
        messages, tokenize=False
    )
    assert (saved.eos_token_id, saved.bos_token_id, len(saved)) == (
        built.eos_token_id,
        built.bos_token_id,
        len(built),
    )

    kept.write_bytes(b"not a pickle")  # a damaged copy: built again from the file, and kept again
    again = load_gguf_tokenizer(path)
    assert again.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    assert tokenizer_cache.read_saved(path.resolve()) is not None
    os.utime(path, ns=(1, 1))  # another file under the same name: a key of its own
    assert tokenizer_cache.tokenizer_file(path.resolve()) != kept
    load_gguf_tokenizer(path)
    tokenizer_cache.prune(kept.parent, keep=1)  # the least recently read goes first
    assert [f.name for f in kept.parent.glob("*.pickle")] == [
        tokenizer_cache.tokenizer_file(path.resolve()).name
    ]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tokenizer_is_the_one_autotokenizer_builds(tmp_path, kind):
    from transformers import AutoTokenizer

    _, path = make_chat_gguf(tmp_path / f"{kind}.gguf", kind)
    ours = load_gguf_tokenizer(path)
    with tempfile.TemporaryDirectory() as alone:
        os.symlink(path, Path(alone) / path.name)
        reference = AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
    assert type(ours) is type(reference)
    assert ours.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    assert (ours.chat_template, ours.eos_token_id, ours.bos_token_id) == (
        reference.chat_template,
        reference.eos_token_id,
        reference.bos_token_id,
    )
    messages = [{"role": "user", "content": "Héllo wörld, 12345 tokens!"}]
    assert ours.apply_chat_template(messages, tokenize=True) == reference.apply_chat_template(
        messages, tokenize=True
    )


def test_fused_linears_are_read_into_one_buffer_and_no_linear_is_float(tmp_path, monkeypatch):
    """q/k/v and gate/up are one buffer each, holding the un-permuted rows; the only float parameters are the norms
    (the tied embedding stays in blocks, shared with the head); no tensor is read through the memory map (np.memmap refused while loading)."""
    cfg = TinyLlama(linear_type=T.Q4_0)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, cfg)
    reader = open_gguf(path)
    expected = dict(iter_gguf_tensors(reader, gguf_hf_config(reader)))

    def no_map(*args, **kwargs):
        raise AssertionError("the loader read a tensor through the memory map")

    with monkeypatch.context() as patch:
        patch.setattr(np, "memmap", no_map)
        model, _ = load_gguf_model(path, torch.float32, CPU, quantization="gguf", reader=reader)
    for i in range(cfg.num_layers):
        attn, mlp = model.layers[i].self_attn.qkv_proj, model.layers[i].mlp.gate_up_proj
        parts = [expected[f"model.layers.{i}.self_attn.{p}_proj.weight"] for p in "qkv"]
        assert torch.equal(attn.blocks, torch.cat([p.blocks for p in parts]))
        assert attn.blocks.untyped_storage().nbytes() == attn.blocks.numel(), "one buffer, exactly the rows"
        parts = [expected[f"model.layers.{i}.mlp.{p}_proj.weight"] for p in ("gate", "up")]
        assert torch.equal(mlp.blocks, torch.cat([p.blocks for p in parts]))
    floats = {name for name, _ in model.named_parameters()}
    assert all(name.endswith("norm.weight") for name in floats)
    assert model.embed_tokens.blocks.data_ptr() == model.lm_head.blocks.data_ptr()
    linear_bytes = sum(
        t.n_bytes for t in reader.tensors if t.name.startswith("blk.") and "norm" not in t.name
    )
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    memory = weight_memory(model)
    assert memory.blocks == linear_bytes + embed.n_bytes  # the tied head reads the embedding's blocks
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size * 4
    assert memory.float == norms
    assert isinstance(
        QuantWeight.cat([p for p in parts]).blocks, torch.Tensor
    )  # separate buffers still concatenate


def _wide_llama_gguf(tmp_path: Path, overrides: dict[str, T]) -> Path:
    hf_model = make_hf_model("llama", seed=3, tie_word_embeddings=False, **WIDE)
    path = tmp_path / "wide.gguf"
    write_hf_model_gguf(
        path, hf_model, linear_type=T.Q4_K, embed_type=T.Q8_0, head_type=T.Q6_K, type_overrides=overrides
    )
    return path


def test_a_format_without_a_block_kernel_loads_with_a_warning_stating_its_cost(tmp_path, caplog):
    path = _wide_llama_gguf(tmp_path, {f"blk.{i}.ffn_down.weight": T.Q2_K for i in range(2)})
    with caplog.at_level(logging.INFO, logger="engine.loading"):
        model, hf_config = load_gguf_model(path, torch.float32, CPU, quantization="gguf", act_q8=False)
    down_bytes = hf_config.num_hidden_layers * WIDE["hidden_size"] * WIDE["intermediate_size"] * 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"blk.*.ffn_down.weight: 2 tensors of Q2_K dequantized to float32: +{human_bytes(down_bytes)} "
        "(no block kernel for Q2_K)"
    ]
    assert "token_embd.weight" not in caplog.text  # the untied Q8_0 embedding stays in blocks: no float copy
    assert isinstance(model.embed_tokens, QuantEmbedding)
    assert type(model.layers[0].mlp.down_proj) is Linear and isinstance(
        model.layers[0].mlp.gate_up_proj, QuantLinear
    )
    reference, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    tokens = list(range(3, 27))
    got, want = teacher_forced_logits(model, tokens, 20), teacher_forced_logits(reference, tokens, 20)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_loading_is_refused_with_the_numbers_when_it_would_not_fit(tmp_path, monkeypatch):
    path = _wide_llama_gguf(tmp_path, {"blk.0.ffn_down.weight": T.Q2_K})
    block_bytes = sum(
        t.n_bytes for t in open_gguf(path).tensors if t.tensor_type not in (T.F32, T.Q2_K)
    )  # the Q8_0 embedding too: kept in blocks
    monkeypatch.setattr(gguf_weights, "available_memory_bytes", lambda: block_bytes - 1)
    with pytest.raises(
        NotEnoughMemory, match=rf"the 15 weights in blocks need {human_bytes(block_bytes)}, but"
    ):
        load_gguf_model(path, torch.float32, CPU, quantization="gguf")
    answers = iter([10**12, 300_000])  # the blocks fit; then (read) the float copies do not
    monkeypatch.setattr(gguf_weights, "available_memory_bytes", lambda: next(answers))
    with pytest.raises(
        NotEnoughMemory, match=r"blk\.\*\.ffn_down\.weight: 1 tensors of Q2_K .* the machine has 300 kB"
    ):
        load_gguf_model(path, torch.float32, CPU, quantization="gguf")
    monkeypatch.setattr(gguf_weights, "available_memory_bytes", lambda: None)  # unknown: no check
    load_gguf_model(path, torch.float32, CPU, quantization="gguf")


def test_engine_logs_and_reports_the_memory(tmp_path, caplog):
    from engine import LLM

    path = write_tiny_chat_gguf(tmp_path / "chat.gguf", linear_type=T.Q4_0)
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = LLM(model=str(path), kv_cache_bytes=2**20, kv_disk_bytes=0)
    stats, engine = llm.engine.stats(), llm.engine
    memory = weight_memory(engine.runner.model)
    assert (stats.weight_bytes_blocks, stats.weight_bytes_float) == (memory.blocks, memory.float)
    assert memory.blocks > 0 and memory.float > 0 and stats.memory_available_bytes > 0
    assert stats.kv_pool_bytes == engine.num_blocks * engine.kv_block_bytes
    line = (
        f"memory: weights {human_bytes(memory.total)} ({human_bytes(memory.blocks)} in blocks, "
        f"{human_bytes(memory.float)} in float) + KV pool {human_bytes(stats.kv_pool_bytes)} ({engine.num_blocks} "
        f"blocks) = {human_bytes(memory.total + stats.kv_pool_bytes)}; "
    )
    assert line in caplog.text and "of the machine's memory left" in caplog.text


def test_the_default_pool_is_sized_from_the_model_and_the_available_memory(tmp_path, monkeypatch, caplog):
    from engine import LLM
    from engine.worker import kv_cache

    path = write_tiny_chat_gguf(tmp_path / "chat.gguf", linear_type=T.Q4_0)
    # 10%: 1 GiB, far above eight sequences of the tiny model
    monkeypatch.setattr(kv_cache, "available_memory_bytes", lambda: 10 * 2**30)
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = LLM(model=str(path), kv_disk_bytes=0, max_model_len=100)
    assert llm.engine.num_blocks == 8 * 7  # eight sequences of 100 tokens: 7 blocks of 16 each
    assert "to between 1 and 8 sequences of max_model_len 100" in caplog.text


def test_linears_kept_in_float_are_logged_once_per_mix_of_formats(caplog):
    from engine.models.llama import LlamaForCausalLM, ModelArgs
    from engine.models.quantized import QuantType, quantize_linears
    from tests.engine.factories import make_hf_config

    model = LlamaForCausalLM(ModelArgs.from_hf_config(make_hf_config("llama")))  # 2 layers: 9 linears
    # in blocks: layer 0's gate_proj alone, its up_proj in float
    gate = QuantWeight(QuantType.Q8_0, torch.zeros(96, 2 * 34, dtype=torch.uint8), 64)
    with caplog.at_level(logging.INFO, logger="engine.models"):
        assert quantize_linears(model, {"model.layers.0.mlp.gate_proj.weight": gate}, act_q8=False) == set()
    assert [r.getMessage() for r in caplog.records if "kept in float" in r.getMessage()] == [
        "linears kept in float (their weights in float): 8, layers.0.self_attn.qkv_proj, ..., lm_head",
        "linears kept in float (their weights in Q8_0 + float): 1, layers.0.mlp.gate_up_proj",
    ]
