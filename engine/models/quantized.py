"""Swapping a Llama model's linears for `QuantLinear`s over GGUF blocks, fused as the model fuses its weights (any
mix of block formats: a fused linear keeps one segment per format), and its embedding for a `QuantEmbedding` over
its blocks, which a tied LM head shares."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.models.llama import LlamaForCausalLM
from engine.native.attention import load_kernel as load_attention_kernel
from engine.native.onednn import Linear
from engine.native.quant_format import (
    FILE_TYPES,
    QuantType,
    QuantWeight,
    dequantize_rows_torch,
    dequantize_torch,
    stack_segments,
)
from engine.native.quant_linear import QuantLinear
from engine.native.quant_linear import load_kernel as load_quant_kernel

__all__ = [
    "FILE_TYPES",
    "QuantEmbedding",
    "QuantLinear",
    "QuantType",
    "QuantWeight",
    "dequantize_torch",
    "fused_linear_sources",
    "linear_modules",
    "native_int8_kernels",
    "quantize_embedding",
    "quantize_linears",
]

EMBEDDING = "model.embed_tokens.weight"

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
    """Replace every linear whose HF weights are all in `quant_weights` by a QuantLinear (parts of different
    formats, as llama-quantize's Q4_K_M mixes them, become segments of one QuantLinear).

    Returns the HF weight names now held in blocks; the caller loads the rest (norms, the embedding unless
    `quantize_embedding` takes it, biases, and any linear with a part in float) through `model.load_weights`. A tied
    LM head reads the embedding's blocks (the very tensor `quantize_embedding` is then given), so the embedding's
    name is not returned here.
    """
    consumed: set[str] = set()
    in_float: dict[str, list[str]] = {}  # the formats of a linear's parts ("Q4_K + float") -> the linears
    for module_name, hf_names in fused_linear_sources(model).items():
        parts = [quant_weights.get(name) for name in hf_names]
        if any(p is None for p in parts):
            formats = " + ".join(dict.fromkeys(p.qtype.name if p else "float" for p in parts))
            in_float.setdefault(formats, []).append(module_name)
            continue
        old = model.get_submodule(module_name)
        assert isinstance(old, nn.Linear), f"{module_name} is {type(old).__name__}, expected a linear"
        segments = stack_segments(parts)  # one run of one format: the part itself, its blocks not copied
        shape = (sum(s.out_features for s in segments), segments[0].in_features)
        if shape != tuple(old.weight.shape):
            raise ValueError(f"{module_name}: quantized weight {shape} != {tuple(old.weight.shape)}")
        bias = None if old.bias is None else torch.zeros_like(old.bias)  # filled by load_weights
        parent_name, _, child = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear(segments, bias, act_q8=act_q8, batch_gemm=batch_gemm))
        if hf_names != [EMBEDDING]:
            consumed.update(hf_names)
    for formats, names in in_float.items():  # one line per mix of formats, not one per linear
        shown = names if len(names) <= 3 else [names[0], "...", names[-1]]
        logger.info(
            "linears kept in float (their weights in %s): %d, %s", formats, len(names), ", ".join(shown)
        )
    return consumed


class QuantEmbedding(nn.Module):
    """The token embedding kept in GGUF blocks: a step's rows are dequantized from them (no float copy of the
    [vocab, hidden] table: 1 GB in fp32 at Llama-3.2-1B's 128,256 x 2,048), in the model's dtype. A tied LM head is a
    QuantLinear over the same blocks tensor, so the bytes are held once."""

    def __init__(self, weight: QuantWeight, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.qtype = int(weight.qtype)
        self.dtype = dtype
        self.register_buffer("blocks", weight.blocks)
        self.kernel = load_quant_kernel()

    @property
    def weight_q(self) -> QuantWeight:
        """The table's blocks, as a QuantWeight."""
        return QuantWeight(QuantType(self.qtype), self.blocks, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtype={QuantType(self.qtype).name}, dtype={self.dtype}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The rows of `input_ids` (int64, any shape) as [*input_ids.shape, embedding_dim]; IndexError for an id
        outside the vocabulary."""
        index = input_ids.reshape(-1).long()
        if self.kernel is not None and index.device.type == "cpu":
            rows = self.kernel.gather(
                self.weight_q, index
            )  # dequantize_gather: C, bit for bit the fused step's
        else:
            if index.numel() and not 0 <= int(index.min()) <= int(index.max()) < self.num_embeddings:
                raise IndexError(f"a token id outside [0, {self.num_embeddings})")
            rows = dequantize_rows_torch(self.weight_q, index.cpu()).to(index.device)
        return rows.to(self.dtype).reshape(*input_ids.shape, self.embedding_dim)


def quantize_embedding(model: LlamaForCausalLM, weight: QuantWeight) -> None:
    """Replace the model's embedding by a QuantEmbedding over `weight` (the file's blocks of
    model.embed_tokens.weight: give the same QuantWeight that `quantize_linears` got, so that a tied LM head and the
    embedding share one blocks tensor). The caller then counts EMBEDDING as held in blocks."""
    old = model.embed_tokens
    if weight.shape != (model.args.vocab_size, model.args.hidden_size):
        raise ValueError(
            f"embedding blocks {weight.shape} != {(model.args.vocab_size, model.args.hidden_size)}"
        )
    dtype = old.weight.dtype if isinstance(old, nn.Embedding) else model.norm.weight.dtype
    model.embed_tokens = QuantEmbedding(weight, dtype)
