"""Swapping a Llama model's linears for `QuantLinear`s over GGUF blocks, fused as the model fuses its weights."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.models.llama import LlamaForCausalLM
from engine.native.attention import load_kernel as load_attention_kernel
from engine.native.onednn import Linear
from engine.native.quant_format import QuantType, QuantWeight, dequantize_torch
from engine.native.quant_linear import QuantLinear
from engine.native.quant_linear import load_kernel as load_quant_kernel

__all__ = [
    "QuantLinear",
    "QuantType",
    "QuantWeight",
    "dequantize_torch",
    "fused_linear_sources",
    "linear_modules",
    "native_int8_kernels",
    "quantize_linears",
]

logger = logging.getLogger(__name__)


def native_int8_kernels() -> bool:
    """Whether the compiled kernels that run GGUF blocks with int8 activations (without them the torch twins keep
    fp32) and the CPU decode attention (which reads an fp16 pool in place) are built here."""
    return load_quant_kernel() is not None and load_attention_kernel() is not None


def linear_modules(model: nn.Module) -> list[nn.Module]:
    """Every linear of the model that multiplies weights: float (the oneDNN-prepacked Linear) or GGUF blocks."""
    return [m for m in model.modules() if isinstance(m, (Linear, QuantLinear))]


def fused_linear_sources(model: LlamaForCausalLM) -> dict[str, list[str]]:
    """Each linear of the model (module name) -> the HF weight names stacked into it, in row order."""
    sources: dict[str, list[str]] = {}
    for i in range(model.args.num_layers):
        layer = f"layers.{i}"
        sources[f"{layer}.self_attn.qkv_proj"] = [f"model.{layer}.self_attn.{p}_proj.weight" for p in "qkv"]
        sources[f"{layer}.self_attn.o_proj"] = [f"model.{layer}.self_attn.o_proj.weight"]
        sources[f"{layer}.mlp.gate_up_proj"] = [f"model.{layer}.mlp.{p}_proj.weight" for p in ("gate", "up")]
        sources[f"{layer}.mlp.down_proj"] = [f"model.{layer}.mlp.down_proj.weight"]
    head = "model.embed_tokens.weight" if model.args.tie_word_embeddings else "lm_head.weight"
    sources["lm_head"] = [head]
    return sources


def quantize_linears(
    model: LlamaForCausalLM, quant_weights: dict[str, QuantWeight], *, act_q8: bool, batch_gemm: str = "fp32"
) -> set[str]:
    """Replace every linear whose HF weights are all in `quant_weights`, in one format, by a QuantLinear.

    Returns the HF weight names now held in blocks; the caller loads the rest (norms, embedding, biases, and any
    linear left in float because its parts differ in format) through `model.load_weights`. A tied LM head reads
    the embedding's blocks, while the embedding itself still needs its float weight, so its name is not returned.
    """
    consumed: set[str] = set()
    for module_name, hf_names in fused_linear_sources(model).items():
        parts = [quant_weights.get(name) for name in hf_names]
        if any(p is None for p in parts) or len({p.qtype for p in parts}) != 1:
            logger.info(
                "%s stays in float: its weights are %s", module_name, [p and p.qtype.name for p in parts]
            )
            continue
        old = model.get_submodule(module_name)
        assert isinstance(old, nn.Linear), f"{module_name} is {type(old).__name__}, expected a linear"
        weight = parts[0] if len(parts) == 1 else QuantWeight.cat(parts)
        if weight.shape != tuple(old.weight.shape):
            raise ValueError(f"{module_name}: quantized weight {weight.shape} != {tuple(old.weight.shape)}")
        bias = None if old.bias is None else torch.zeros_like(old.bias)  # filled by load_weights
        parent_name, _, child = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear(weight, bias, act_q8=act_q8, batch_gemm=batch_gemm))
        if hf_names != ["model.embed_tokens.weight"]:
            consumed.update(hf_names)
    return consumed
