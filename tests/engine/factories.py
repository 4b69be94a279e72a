"""Shared `make_*` factories for engine tests: tiny HF configs and models, block tables, attention metadata."""

from __future__ import annotations

from typing import Any

import torch

from engine.attention.metadata import AttentionMetadata
from engine.core.utils import cdiv
from engine.models.llama import LlamaForCausalLM, ModelArgs

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=10000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,  # wavelengths of head_dim 16 straddle 16..64: all three bands occur
)
HF_KINDS = ("llama", "llama3", "qwen2", "mistral")


def make_hf_config(kind: str, **overrides: Any) -> Any:
    """A tiny transformers config of the given family (GQA 4:2, hidden 64, 2 layers)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    fields = {**TINY, **overrides}
    if kind == "llama":
        return LlamaConfig(**fields)
    if kind == "llama3":
        return LlamaConfig(rope_parameters=dict(LLAMA3_ROPE), **fields)
    if kind == "qwen2":
        return Qwen2Config(**fields)
    if kind == "mistral":
        fields.setdefault("sliding_window", fields["max_position_embeddings"])  # a window covering everything
        return MistralConfig(**fields)
    raise ValueError(f"unknown kind {kind!r}")


def randomize_(module: torch.nn.Module, seed: int, std: float = 0.15) -> None:
    """Give every parameter (norm weights and biases too) distinct random values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=gen) * std
            param.copy_(1.0 + noise if name.endswith("norm.weight") else noise)


def make_hf_model(kind: str, seed: int = 0, **overrides: Any) -> Any:
    """A random fp32 transformers model of the given family, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = make_hf_config(kind, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize_(model, seed)
    return model


def make_model_from_hf(hf_model: Any, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Our model with the HF model's weights copied in through load_weights."""
    model = LlamaForCausalLM(ModelArgs.from_hf_config(hf_model.config))
    model.load_weights(hf_model.state_dict().items())
    return model.to(dtype).eval().requires_grad_(False)


def make_block_tables(
    seq_lens: list[int], block_size: int, num_blocks: int, seed: int = 0
) -> list[list[int]]:
    """Distinct, shuffled (non-contiguous) block ids covering each sequence's seq_len tokens."""
    needed = [cdiv(n, block_size) for n in seq_lens]
    assert sum(needed) <= num_blocks, f"pool of {num_blocks} blocks cannot hold {sum(needed)}"
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, used = [], 0
    for n in needed:
        tables.append(ids[used : used + n])
        used += n
    return tables


def make_attention_metadata(
    query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], block_size: int
) -> AttentionMetadata:
    """Metadata for sequences whose last query_lens[i] of seq_lens[i] tokens are new this step."""
    for seq_len, table in zip(seq_lens, block_tables, strict=True):
        assert len(table) * block_size >= seq_len, f"table {table} too short for {seq_len} tokens"
    return AttentionMetadata.build(query_lens, seq_lens, block_tables, block_size)


def make_kv_caches(
    args: ModelArgs, num_blocks: int, block_size: int, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (k_cache, v_cache) filled with finite garbage, so that unmasked stale slots show up in results."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
    return [
        (torch.randn(shape, generator=gen).to(dtype) * 5, torch.randn(shape, generator=gen).to(dtype) * 5)
        for _ in range(args.num_layers)
    ]


def fp32_attention_tol(head_dim: int) -> dict[str, float]:
    """How far the CPU decode kernel's fp32 attention may be from the reference's over the same values: atol 1e-5,
    rtol 3e-5 at head_dim 64, growing with the length of a score's dot (head_dim 128 was up to 1.3e-5 off)."""
    grow = max(1.0, head_dim / 64)
    return {"atol": 1e-5 * grow, "rtol": 3e-5 * grow}


# the decode-attention kernel built for this CPU and for AVX2 alone: an AVX-512 CPU runs its own 16-float kernel for
# caches of the query's dtype and the 8-float one for the rest, an AVX2 CPU the 8-float one for all
ATTENTION_MARCHES = ["native", "x86-64-v3"]


def attention_kernel(march: str):
    """engine.native.attention's kernel built for `march`; skips the test where it cannot be built here."""
    import pytest

    from engine.native.attention import load_kernel

    kernel = load_kernel(march)
    if kernel is None:
        pytest.skip(f"the attention kernel cannot be built here for {march}")
    return kernel
