"""Tiny Llama GGUF files written with gguf.GGUFWriter, as llama.cpp's converter lays them out (q/k rows permuted)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.native.quant_format import QuantType
from tests.engine.factories import make_attention_metadata, make_block_tables, make_kv_caches

T = gguf.GGMLQuantizationType
BLOCK_SIZE, NUM_BLOCKS = 4, 32


@dataclass(frozen=True)
class TinyLlama:
    """Hyperparameters of the tiny model: widths are whole 32-blocks but (mostly) not multiples of 64."""

    vocab_size: int = 128
    hidden_size: int = 96
    intermediate_size: int = 160
    num_layers: int = 2
    num_heads: int = 3
    num_kv_heads: int = 1
    context_length: int = 256
    rope_theta: float = 50000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2
    linear_type: T = T.Q4_1  # every projection
    embed_type: T = T.Q8_0
    head_type: T = T.Q8_0  # only when not tied
    type_overrides: dict[str, T] = field(default_factory=dict)  # GGUF tensor name -> type

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """The row permutation convert_hf_to_gguf.py applies to q/k projections (LlamaModel.permute)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(cfg: TinyLlama, seed: int) -> dict[str, np.ndarray]:
    """Random fp32 weights by GGUF name, in HF row order (before the q/k permutation)."""
    gen = np.random.default_rng(seed)
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (gen.standard_normal(shape) * scale).astype(np.float32)

    weights = {"token_embd.weight": rand(cfg.vocab_size, h, scale=1.0), "output_norm.weight": 1 + rand(h)}
    if not cfg.tie_word_embeddings:
        weights["output.weight"] = rand(cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        weights |= {
            f"blk.{n}.attn_norm.weight": 1 + rand(h),
            f"blk.{n}.ffn_norm.weight": 1 + rand(h),
            f"blk.{n}.attn_q.weight": rand(cfg.num_heads * d, h),
            f"blk.{n}.attn_k.weight": rand(cfg.num_kv_heads * d, h),
            f"blk.{n}.attn_v.weight": rand(cfg.num_kv_heads * d, h),
            f"blk.{n}.attn_output.weight": rand(h, cfg.num_heads * d),
            f"blk.{n}.ffn_gate.weight": rand(i, h),
            f"blk.{n}.ffn_up.weight": rand(i, h),
            f"blk.{n}.ffn_down.weight": rand(h, i),
        }
    return weights


def tensor_type(cfg: TinyLlama, name: str) -> T:
    if name in cfg.type_overrides:
        return cfg.type_overrides[name]
    if name.endswith("norm.weight"):
        return T.F32
    return {"token_embd.weight": cfg.embed_type, "output.weight": cfg.head_type}.get(name, cfg.linear_type)


def encode(w: np.ndarray, kind: T) -> np.ndarray:
    """The array GGUFWriter.add_tensor takes for `kind`: floats as is, block formats as their bytes."""
    if kind == T.F32:
        return w
    if kind == T.F16:
        return w.astype(np.float16)
    if kind in RANDOM_BLOCK_TYPES:  # random blocks of w's shape (seeded by it): w's values are not kept
        return random_blocks(kind, w.shape[0], w.shape[1], seed=int(abs(w[0, :4]).sum() * 1e4), scale=0.001)
    return gguf.quants.quantize(w, kind)


RANDOM_BLOCK_TYPES = (
    T.Q3_K,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.IQ4_XS,
)  # gguf-py cannot quantize these: random blocks


def random_blocks(kind: T, rows: int, cols: int, seed: int, scale: float = 0.05) -> np.ndarray:
    """uint8 [rows, row bytes]: random blocks of `kind` whose fp16 fields are finite scales (and minimums) of either
    sign up to `scale` (speed and the kernels' agreement do not depend on how blocks were chosen)."""
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    gen = np.random.default_rng(seed)
    nb = cols // block_weights
    raw = gen.integers(0, 256, (rows, nb, block_bytes), dtype=np.uint8)
    for offset in QuantType(int(kind)).fp16_offsets:
        values = gen.uniform(scale / 25, scale, (rows, nb)) * gen.choice([-1, 1], (rows, nb))
        raw[:, :, offset : offset + 2] = values.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def expected_dequantized(w: np.ndarray, kind: T) -> torch.Tensor:
    """What a reader must return for w stored as `kind`, by gguf's own dequantization (rows are independent)."""
    if kind in (T.F32, T.F16):
        return torch.from_numpy(encode(w, kind).astype(np.float32))
    return torch.from_numpy(gguf.quants.dequantize(encode(w, kind), kind).copy())


def add_tokenizer(writer: gguf.GGUFWriter, tokenizer: Any) -> None:
    """A byte-level BPE tokenizer as llama.cpp stores it: tokens by id, their types, merges, special ids."""
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens))), "token ids must be dense"
    special = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_chat_template(tokenizer.chat_template)


def add_hparams(
    writer: gguf.GGUFWriter,
    *,
    context: int,
    hidden: int,
    layers: int,
    ffn: int,
    heads: tuple[int, int, int],
    rope_theta: float,
    eps: float,
    vocab: int,
) -> None:
    """A Llama-family file's hyperparameters; `heads` is (query heads, KV heads, head dim)."""
    num_heads, num_kv_heads, head_dim = heads
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_freq_base(rope_theta)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_vocab_size(vocab)


def write_tiny_gguf(
    path: Path, cfg: TinyLlama, seed: int = 0, tokenizer: Any | None = None
) -> dict[str, np.ndarray]:
    """Write the tiny model (with `tokenizer`'s vocabulary when given) to `path`; returns its fp32 weights by GGUF
    name, in HF row order."""
    weights = hf_weights(cfg, seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    add_hparams(
        writer,
        context=cfg.context_length,
        hidden=cfg.hidden_size,
        layers=cfg.num_layers,
        ffn=cfg.intermediate_size,
        heads=(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        rope_theta=cfg.rope_theta,
        eps=cfg.rms_norm_eps,
        vocab=cfg.vocab_size,
    )
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    if tokenizer is None:
        writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    else:
        add_tokenizer(writer, tokenizer)
    for name, w in weights.items():
        if ".attn_q." in name:
            w = llama_cpp_permute(w, cfg.num_heads)
        elif ".attn_k." in name:
            w = llama_cpp_permute(w, cfg.num_kv_heads)
        kind = tensor_type(cfg, name)
        writer.add_tensor(name, encode(w, kind), raw_dtype=None if kind in (T.F32, T.F16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def write_tiny_chat_gguf(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """The tiny model with a trained byte-level BPE tokenizer and a ChatML template: loadable by LLM(model=path)."""
    from tests.engine.bench_helpers import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    cfg = TinyLlama(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **overrides,
    )
    write_tiny_gguf(path, cfg, seed, tokenizer=tokenizer)
    return path


def write_q4km_like_gguf(path: Path, seed: int, embed_type: T, extra: dict[str, T] | None = None) -> Path:
    """Q4_K_M's mix in small (a chat GGUF as write_tiny_chat_gguf's): q/k/o/gate/up Q4_K, v and down Q6_K, a tied
    embedding in `embed_type`, `extra` overriding more tensors' types; widths whole super-blocks of 256."""
    overrides = {f"blk.{n}.{part}.weight": T.Q6_K for n in range(2) for part in ("attn_v", "ffn_down")}
    return write_tiny_chat_gguf(
        path,
        seed=seed,
        hidden_size=256,
        intermediate_size=512,
        num_heads=4,
        num_kv_heads=2,
        linear_type=T.Q4_K,
        embed_type=embed_type,
        type_overrides={**overrides, **(extra or {})},
    )


def teacher_forced_logits(model, tokens: list[int], prefill_len: int) -> torch.Tensor:
    """Logits of every token: one prefill of prefill_len tokens, then one decode step per remaining token."""
    caches = make_kv_caches(model.args, NUM_BLOCKS, BLOCK_SIZE, dtype=model.norm.weight.dtype)
    table = make_block_tables([len(tokens)], BLOCK_SIZE, NUM_BLOCKS, seed=1)
    backend, rows, done = TorchAttentionBackend(BLOCK_SIZE), [], 0
    for n in [prefill_len] + [1] * (len(tokens) - prefill_len):
        meta = make_attention_metadata([n], [done + n], table, BLOCK_SIZE)
        backend.prepare(meta)
        ids, positions = torch.tensor(tokens[done : done + n]), torch.arange(done, done + n)
        with torch.no_grad():
            rows.append(model.compute_logits(model(ids, positions, caches, meta, backend)))
        done += n
    return torch.cat(rows)
