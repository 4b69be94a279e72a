"""A GGUF file's metadata as a transformers config: the Llama-family architectures llama.cpp writes.

- `llama`: Llama 1/2/3, SmolLM2 and Mistral 7B (llama.cpp's converter writes Mistral as `llama`, without its
  sliding window). Llama 3.1+ RoPE scaling comes as the `rope_freqs` tensor: one divisor per rotary frequency,
  computed by the converter from the HF `llama3` parameters, kept as `rope_freq_factors` (what llama.cpp uses).
- `qwen2`: q/k/v biases, usually tied embeddings; its q/k rows are stored in HF order (NEOX-style RoPE).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.loading.light_config import light_llama_config

ARCHITECTURE_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2"}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURE_TO_MODEL_TYPE)
# llama.cpp permutes the q/k rows of architectures it rotates as adjacent pairs; the others keep HF's order
PERMUTED_QK_ARCHITECTURES = ("llama",)
ROPE_SCALING_TYPES = ("none", "linear")  # {arch}.rope.scaling.type values; Llama 3's scaling is rope_freqs
_MISSING = object()


def gguf_field(reader: Any, key: str, default: Any = _MISSING) -> Any:
    """A metadata value (scalar, string or list); `default` when absent, else ValueError."""
    value = reader.value(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ValueError(f"GGUF file has no metadata key {key!r}")
        return default
    return value


def gguf_architecture(reader: Any) -> str:
    """`general.architecture`, checked against the supported ones."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHITECTURES}")
    return arch


def _one_value(value: Any, key: str) -> Any:
    """A per-layer list that must hold one value for all layers, or a scalar."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"{key} differs between layers ({value}); not supported")
        return value[0]
    return value


def _rope_parameters(reader: Any, arch: str) -> dict[str, Any]:
    """HF rope parameters from `{arch}.rope.*` (theta, linear scaling)."""
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        rope |= {"rope_type": "linear", "factor": float(gguf_field(reader, f"{arch}.rope.scaling.factor"))}
    elif scaling not in ROPE_SCALING_TYPES:
        raise ValueError(
            f"GGUF RoPE scaling {scaling!r} is not supported; supported: {ROPE_SCALING_TYPES} "
            "(and Llama 3's rope_freqs tensor)"
        )
    return rope


def _rope_freq_factors(reader: Any, head_dim: int) -> list[float] | None:
    """The `rope_freqs` tensor (Llama 3.1+ scaling) as a list of head_dim / 2 divisors, or None."""
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return None
    factors = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
    if factors.shape[0] != head_dim // 2 or not np.isfinite(factors).all() or (factors <= 0).any():
        raise ValueError(
            f"GGUF rope_freqs holds {factors.shape[0]} values; expected {head_dim // 2} positive finite ones"
        )
    return [float(f) for f in factors]


def gguf_hf_config(reader: Any) -> Any:
    """A transformers LlamaConfig or Qwen2Config with the file's hyperparameters and special token ids."""
    arch = gguf_architecture(reader)
    names = {t.name for t in reader.tensors}
    hidden = int(gguf_field(reader, f"{arch}.embedding_length"))
    num_heads = int(_one_value(gguf_field(reader, f"{arch}.attention.head_count"), "head_count"))
    num_kv_heads = gguf_field(reader, f"{arch}.attention.head_count_kv", num_heads)
    head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", hidden // num_heads))
    rope_dim = int(gguf_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial RoPE (rope dims {rope_dim} of head_dim {head_dim}) is not supported")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    token_id = {
        f"{kind}_token_id": gguf_field(reader, f"tokenizer.ggml.{key}_token_id", None)
        for kind, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))
    }
    fields: dict[str, Any] = dict(
        vocab_size=int(gguf_field(reader, f"{arch}.vocab_size", int(embed.shape[1]))),
        hidden_size=hidden,
        intermediate_size=int(
            _one_value(gguf_field(reader, f"{arch}.feed_forward_length"), "feed_forward_length")
        ),
        num_hidden_layers=int(gguf_field(reader, f"{arch}.block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(_one_value(num_kv_heads, "head_count_kv")),
        head_dim=head_dim,
        max_position_embeddings=int(gguf_field(reader, f"{arch}.context_length")),
        rms_norm_eps=float(gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_parameters=_rope_parameters(reader, arch),
        tie_word_embeddings="output.weight" not in names,
        **{k: None if v is None else int(v) for k, v in token_id.items()},
    )
    if arch == "qwen2":  # q/k/v biases are part of the architecture; no o/mlp bias, no sliding window in GGUF
        from transformers import Qwen2Config

        return Qwen2Config(use_sliding_window=False, **fields)
    factors = _rope_freq_factors(reader, head_dim)
    if factors is not None:
        fields["rope_freq_factors"] = factors  # read by ModelArgs.from_hf_config
    fields.update(attention_bias="blk.0.attn_q.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names)
    # every value named: the light config reads the same as LlamaConfig (light_config), unless the file scales RoPE;
    # transformers' config module is imported only when it is needed (its import takes seconds: light_config.py)
    light = light_llama_config({"model_type": "llama", **fields})
    if light is not None:
        return light
    from transformers import LlamaConfig

    return LlamaConfig(**fields)
