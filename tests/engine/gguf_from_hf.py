"""A transformers model written as a GGUF file the way llama.cpp's convert_hf_to_gguf.py lays it out, and K-quant
blocks built from random bytes (gguf.quants cannot quantize the K formats; it can dequantize them: the oracle).

Qwen2 is written as `qwen2` (q/k rows in HF order, q/k/v biases); Llama and Mistral as `llama` (q/k rows permuted,
no sliding window); Llama 3 scaling as the `rope_freqs` tensor, computed from the HF llama3 parameters as the
converter computes it. The model's weights are then replaced by what the file holds, so both hold the same weights.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from tests.engine.bench_helpers import make_tiny_tokenizer
from tests.engine.factories import make_hf_model
from tests.engine.gguf_factories import T, add_hparams, add_tokenizer, encode, llama_cpp_permute

K_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
RANDOM_TYPES = (*K_TYPES, T.IQ4_NL)  # written as random blocks (IQ4_NL: a format the loader refuses)
# byte offsets of each block's fp16 (super-)block scale and (where it has one) min, and their typical values: the
# mins centre the unsigned quants (min ~ mean quant x scale), so the random weights have mean ~0 and std ~0.1-0.3
BLOCK_SCALES: dict[T, tuple[tuple[int, float], ...]] = {
    T.Q2_K: ((80, 0.01), (82, 0.015)),  # scales[16] qs[64] d dmin: w = d * (sc & 15) * q - dmin * (sc >> 4)
    T.Q3_K: ((108, 0.005),),  # hmask[32] qs[64] scales[12] d: w = d * (sc - 32) * (q - 4)
    T.Q4_K: ((0, 1e-3), (2, 7.5e-3)),  # d dmin scales[12] qs[128]: w = d * sc * q - dmin * m
    T.Q5_K: ((0, 5e-4), (2, 7.5e-3)),  # d dmin scales[12] qh[32] qs[128]
    T.Q6_K: ((208, 1e-4),),  # ql[128] qh[64] scales[16] d: w = d * sc * (q - 32)
    T.IQ4_NL: ((0, 2e-3),),  # d qs[16]: w = d * kvalues[q], a non-linear 4-bit grid
}
# K formats are 256-weight super-blocks: every linear's input width a multiple of 256
WIDE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def random_blocks(rows: int, cols: int, kind: T, gen: np.random.Generator) -> np.ndarray:
    """[rows, cols / 256 * block bytes] uint8: random quants and sub-block scales, fp16 super-block scales and mins
    set to random values near BLOCK_SCALES (random bytes there would give NaN and inf)."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    assert cols % block_size == 0, f"{cols} columns are not whole {kind.name} blocks of {block_size}"
    blocks = gen.integers(0, 256, (rows, cols // block_size, block_bytes), dtype=np.uint8)
    for offset, typical in BLOCK_SCALES[kind]:
        scale = (typical * gen.uniform(0.5, 1.5, (rows, cols // block_size))).astype(np.float16)
        blocks[..., offset : offset + 2] = scale.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def gguf_name(hf_name: str) -> str:
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight."""
    module, _, leaf = hf_name.rpartition(".")
    if module in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[module]}.{leaf}"
    _, _, layer, sub = module.split(".", 3)
    return f"blk.{layer}.{LAYER_NAMES[sub]}.{leaf}"


def llama3_rope_freqs(config: Any) -> np.ndarray:
    """The converter's rope_freqs for an HF llama3 rope: per frequency, the divisor of its inverse frequency."""
    rope = config.rope_parameters
    dim = config.head_dim
    factor, old_len = rope["factor"], rope["original_max_position_embeddings"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (i / dim)
        if wavelen < old_len / high:
            factors.append(1.0)
        elif wavelen > old_len / low:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _tensor_type(name: str, linear_type: T, embed_type: T, head_type: T, overrides: dict[str, T]) -> T:
    if name in overrides:
        return overrides[name]
    if name.endswith("norm.weight") or name.endswith(".bias"):
        return T.F32
    return {"token_embd.weight": embed_type, "output.weight": head_type}.get(name, linear_type)


def write_hf_model_gguf(
    path: Any,
    hf_model: Any,
    *,
    linear_type: T = T.F32,
    embed_type: T = T.F32,
    head_type: T = T.F32,
    type_overrides: dict[str, T] | None = None,
    tokenizer: Any | None = None,
    seed: int = 0,
) -> dict[str, T]:
    """Write `hf_model` to `path` as llama.cpp would; its weights become the file's (dequantized) values.

    K formats get random blocks (see random_blocks), the others gguf.quants.quantize of the model's weights.
    Returns each GGUF tensor's format."""
    config, overrides = hf_model.config, type_overrides or {}
    arch = "qwen2" if config.model_type == "qwen2" else "llama"
    rope = config.rope_parameters
    writer = gguf.GGUFWriter(str(path), arch)
    add_hparams(
        writer,
        context=config.max_position_embeddings,
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        ffn=config.intermediate_size,
        heads=(config.num_attention_heads, config.num_key_value_heads, config.head_dim),
        rope_theta=rope["rope_theta"],
        eps=config.rms_norm_eps,
        vocab=config.vocab_size,
    )
    if tokenizer is None:
        writer.add_eos_token_id(2 if config.eos_token_id is None else config.eos_token_id)
        writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    else:
        writer.add_bos_token_id(tokenizer.bos_token_id)
        writer.add_eos_token_id(tokenizer.eos_token_id)
        add_tokenizer(writer, tokenizer)
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(config))
    gen, kinds = np.random.default_rng(seed), {}
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    params = dict(hf_model.named_parameters())  # a tied lm_head is not listed: llama.cpp writes no output
    with torch.no_grad():
        for hf_name, param in params.items():
            name = gguf_name(hf_name)
            kind = kinds[name] = _tensor_type(name, linear_type, embed_type, head_type, overrides)
            w = param.detach().float().numpy()
            data = random_blocks(*w.shape, kind, gen) if kind in RANDOM_TYPES else encode(w, kind)
            stored = data if kind in (T.F32, T.F16) else gguf.quants.dequantize(data, kind)
            param.copy_(torch.from_numpy(np.asarray(stored, dtype=np.float32).reshape(w.shape)))
            part = name.split(".")[2] if name.startswith("blk.") else ""
            if arch == "llama" and part in heads:  # weights and biases alike
                data = llama_cpp_permute(data, heads[part])
            writer.add_tensor(name, data, raw_dtype=None if kind in (T.F32, T.F16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return kinds


def make_chat_gguf(path: Path, kind: str, wide: bool = False, **formats: Any) -> tuple[Any, Path]:
    """A random HF model of `kind` (`wide`: K-quant widths) with the tiny BPE tokenizer and ChatML template,
    written to `path`."""
    tokenizer = make_tiny_tokenizer()
    config = dict(vocab_size=len(tokenizer), tie_word_embeddings=kind == "qwen2", **(WIDE if wide else {}))
    hf_model = make_hf_model(kind, seed=5, **config)
    write_hf_model_gguf(path, hf_model, tokenizer=tokenizer, **formats)
    return hf_model, path
