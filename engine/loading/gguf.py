"""Llama-family GGUF files read directly: the config from the metadata, tensors by HF name, quantized blocks kept.

Q4_0/Q4_1/Q8_0 tensors stay in their blocks (`QuantWeight`); F32/F16/BF16 tensors become torch tensors; any other
format is dequantized with gguf.quants. llama.cpp's converter permutes the rows of q/k projections so that RoPE
rotates adjacent pairs; the HF layout rotates halves, so those rows are moved back. Each row is whole blocks,
so the permutation moves blocks and never re-quantizes.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.models.llama import LlamaForCausalLM, ModelArgs
from engine.models.quantized import QuantType, QuantWeight, dequantize_torch, quantize_linears

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama",)
QUANTIZATIONS = ("gguf", "none")  # keep the GGUF blocks in QuantLinear, or dequantize every weight to dtype
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MISSING = object()


def is_gguf_file(path: str | Path) -> bool:
    """Whether `path` names a GGUF file (by its suffix and its magic bytes)."""
    path = Path(path).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def open_gguf(path: str | Path) -> Any:
    """A gguf.GGUFReader over the file (memory-mapped: tensors are read when used)."""
    from gguf import GGUFReader

    return GGUFReader(Path(path).expanduser())


def gguf_field(reader: Any, key: str, default: Any = _MISSING) -> Any:
    """A metadata value (scalar, string or list); `default` when absent, else ValueError."""
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF file has no metadata key {key!r}")
        return default
    return field.contents()


def _one_value(value: Any, key: str) -> Any:
    """A per-layer list that must hold one value for all layers, or a scalar."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(f"{key} differs between layers ({value}); not supported")
        return value[0]
    return value


def gguf_hf_config(reader: Any) -> Any:
    """A transformers LlamaConfig with the file's hyperparameters and special token ids."""
    from transformers import LlamaConfig

    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHITECTURES}")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(
            "GGUF file has rope_freqs (Llama 3.1 style RoPE scaling), which is not supported yet"
        )
    hidden = int(gguf_field(reader, f"{arch}.embedding_length"))
    num_heads = int(_one_value(gguf_field(reader, f"{arch}.attention.head_count"), "head_count"))
    num_kv_heads = gguf_field(reader, f"{arch}.attention.head_count_kv", num_heads)
    head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", hidden // num_heads))
    rope_dim = int(gguf_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial RoPE (rope dims {rope_dim} of head_dim {head_dim}) is not supported")
    rope = {
        "rope_type": "default",
        "rope_theta": float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        rope |= {"rope_type": "linear", "factor": float(gguf_field(reader, f"{arch}.rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"GGUF RoPE scaling {scaling!r} is not supported; supported: none, linear")
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    token_id = {
        f"{kind}_token_id": gguf_field(reader, f"tokenizer.ggml.{key}_token_id", None)
        for kind, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))
    }
    return LlamaConfig(
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
        rope_parameters=rope,
        attention_bias="blk.0.attn_q.bias" in names,
        mlp_bias="blk.0.ffn_up.bias" in names,
        tie_word_embeddings="output.weight" not in names,
        **{k: None if v is None else int(v) for k, v in token_id.items()},
    )


def hf_tensor_name(gguf_name: str) -> str:
    """The HF name of a GGUF tensor (blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama model")


def unpermute_index(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation: HF row (head, half, i) is GGUF row (head, i, half)."""
    half_dim = num_rows // num_heads // 2
    assert half_dim * 2 * num_heads == num_rows, (
        f"{num_rows} rows do not split into {num_heads} heads of pairs"
    )
    return torch.arange(num_rows).view(num_heads, half_dim, 2).transpose(1, 2).reshape(-1)


def read_tensor(tensor: Any) -> torch.Tensor | QuantWeight:
    """One GGUF tensor: blocks kept for Q4_0/Q4_1/Q8_0, a torch tensor (float dtype kept) otherwise."""
    from gguf import GGMLQuantizationType, quants

    kind = tensor.tensor_type
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
    if int(kind) in {int(q) for q in QuantType}:
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).reshape(shape[0], -1)
        return QuantWeight(QuantType(int(kind)), blocks, shape[-1])
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(np.array(tensor.data)).reshape(shape)
    if kind == GGMLQuantizationType.BF16:
        return torch.from_numpy(np.array(tensor.data).view(np.int16)).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(quants.dequantize(tensor.data, kind)).reshape(shape)


def iter_gguf_tensors(reader: Any, hf_config: Any) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """Every tensor by HF name, q/k projection rows back in HF order."""
    heads = {"q_proj": hf_config.num_attention_heads, "k_proj": hf_config.num_key_value_heads}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        value = read_tensor(tensor)
        proj = name.split(".")[-2]
        if ".self_attn." in name and proj in heads:
            rows = value.out_features if isinstance(value, QuantWeight) else value.shape[0]
            index = unpermute_index(rows, heads[proj])
            value = value.select_rows(index) if isinstance(value, QuantWeight) else value[index].contiguous()
        yield name, value


def as_float(value: torch.Tensor | QuantWeight) -> torch.Tensor:
    """A tensor as is, or a quantized weight dequantized to fp32."""
    return dequantize_torch(value) if isinstance(value, QuantWeight) else value


def load_gguf_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    *,
    quantization: str = "gguf",
    max_model_len: int | None = None,
    act_q8: bool = False,
    reader: Any | None = None,
) -> tuple[LlamaForCausalLM, Any]:
    """The model of a GGUF file and its LlamaConfig; eval mode, no grad.

    quantization="gguf" keeps Q4_0/Q4_1/Q8_0 linears (and a tied head) in QuantLinear, CPU only; act_q8=True then
    quantizes decode activations to int8 per 32-block as llama.cpp does (see QuantLinear): on SmolLM2 it moved
    logits by up to ~0.7 (one top-1 change in 32 positions) for ~1.4x less CPU time in the linears on an AVX2
    machine, hence off by default.
    "none" dequantizes every weight to dtype. Norms, the embedding and biases are always loaded in dtype.
    `reader`: open_gguf(path) when the caller has it already (parsing the metadata takes seconds for a large vocab).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported; supported: {QUANTIZATIONS}")
    if quantization == "gguf" and torch.device(device).type != "cpu":
        raise ValueError(f"quantization='gguf' runs on the CPU only, not {device}; use quantization='none'")
    start = time.monotonic()
    reader = open_gguf(path) if reader is None else reader
    hf_config = gguf_hf_config(reader)
    args = ModelArgs.from_hf_config(hf_config, max_model_len=max_model_len)
    with torch.device("meta"):  # no random init: every weight is overwritten by the file's
        model = LlamaForCausalLM(args).to(dtype)
    model = model.to_empty(device=device)
    model.rebuild_after_to_empty()
    tensors = dict(iter_gguf_tensors(reader, hf_config))
    in_blocks: set[str] = set()
    if quantization == "gguf":
        quant = {name: t for name, t in tensors.items() if isinstance(t, QuantWeight)}
        in_blocks = quantize_linears(model, quant, act_q8=act_q8)
    model.load_weights((name, as_float(t)) for name, t in tensors.items() if name not in in_blocks)
    model.eval().requires_grad_(False)
    logger.info(
        "loaded %s (%s, %s, quantization=%s: %d weights in blocks) in %.1f s",
        path, dtype, device, quantization, len(in_blocks), time.monotonic() - start,
    )  # fmt: skip
    return model, hf_config


def gguf_chat_template(reader: Any) -> str | None:
    """The chat template stored in the file's metadata, if any."""
    return gguf_field(reader, "tokenizer.chat_template", None)


def load_gguf_tokenizer(path: str | Path) -> Any:
    """The tokenizer (with its chat template) that transformers builds from the file's metadata."""
    from transformers import AutoTokenizer

    path = Path(path).expanduser().resolve()
    # from_pretrained(folder, gguf_file=...) also reads the folder's tokenizer_config.json, which then overrides the
    # file's chat template (the provisioned default-model folder keeps its GGUF beside such files): a folder of one
    with tempfile.TemporaryDirectory(prefix="pagedchat-gguf-") as alone:
        os.symlink(path, Path(alone) / path.name)
        return AutoTokenizer.from_pretrained(alone, gguf_file=path.name)
