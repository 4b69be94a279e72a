"""Which tensor gets which type in a file of a given llama-quantize file type (src/llama-quant.cpp's rules).

The rules below are those llama-quantize applies, without an importance matrix or overrides, to a dense Llama/Qwen2
model (no experts, not Falcon, not a 70B):
- 1-D tensors (norms, biases, rope_freqs) stay F32: only 2-D weights are quantized.
- The output head, and the token embedding when it is tied to it, get Q6_K (Q8_0 in a Q8_0 file, or when the width
  is no whole block of the file's type); an untied embedding gets the file's type.
- Q4_K_M and Q5_K_M give attn_v and ffn_down Q6_K in the "use more bits" layers: the first and last eighth of the
  layers and every third one between. llama-quantize counts attn_v tensors and ffn_down tensors in the order it
  walks them (by layer number), so here that counter is the layer number.
- A type whose block does not divide the row width falls back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16
  when even that does not divide it.
tests/bench/make_gguf/llama_quantize_types.json holds what the real llama-quantize chose for the tiny shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from bench.make_gguf.shapes import ModelShape

T = GGMLQuantizationType
# --type: llama-quantize's file type names -> (general.file_type, the type of most tensors)
FILE_TYPES: dict[str, tuple[LlamaFileType, GGMLQuantizationType]] = {
    "Q4_K_M": (LlamaFileType.MOSTLY_Q4_K_M, T.Q4_K),
    "Q5_K_M": (LlamaFileType.MOSTLY_Q5_K_M, T.Q5_K),
    "Q6_K": (LlamaFileType.MOSTLY_Q6_K, T.Q6_K),
    "Q8_0": (LlamaFileType.MOSTLY_Q8_0, T.Q8_0),
    "Q4_0": (LlamaFileType.MOSTLY_Q4_0, T.Q4_0),
    "F16": (LlamaFileType.MOSTLY_F16, T.F16),  # what a converter writes: llama-quantize's input
    "F32": (LlamaFileType.ALL_F32, T.F32),
}
FALLBACKS = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
MORE_BITS_FILE_TYPES = ("Q4_K_M", "Q5_K_M")
LAYER_PARTS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file: GGUF name, shape in HF (row-major) order, type."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType


def use_more_bits(layer: int, num_layers: int) -> bool:
    """llama-quantize's layers that get more bits in Q4_K_M/Q5_K_M: first and last eighth, and every third."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def fits(kind: GGMLQuantizationType, width: int) -> bool:
    """Whether rows of `width` values are whole blocks of `kind`."""
    return width % GGML_QUANT_SIZES[kind][0] == 0


def with_fallback(kind: GGMLQuantizationType, width: int) -> GGMLQuantizationType:
    """`kind`, or llama-quantize's 32-block fallback (then F16) when its block does not divide `width`."""
    if fits(kind, width):
        return kind
    kind = FALLBACKS.get(kind, kind)
    return kind if fits(kind, width) else T.F16


def weight_type(name: str, width: int, file_type: str, tied: bool, num_layers: int) -> GGMLQuantizationType:
    """The type of the 2-D weight `name` (rows of `width` values) in a file of `file_type`."""
    default = FILE_TYPES[file_type][1]
    if default in (T.F16, T.F32):
        return default
    part = name.split(".")[-2]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        # Q8_0 where the file's own block does not fit the width (judged before the Q6_K fallback)
        kind = T.Q6_K if fits(default, width) and default != T.Q8_0 else T.Q8_0
    elif part in ("attn_v", "ffn_down") and file_type in MORE_BITS_FILE_TYPES:
        layer = int(name.split(".")[1])
        kind = T.Q6_K if use_more_bits(layer, num_layers) else default
    else:
        kind = default
    return with_fallback(kind, width)


def layer_tensors(shape: ModelShape, layer: int) -> list[tuple[str, tuple[int, ...]]]:
    """One layer's tensors (name, HF shape) in the order a converter writes them."""
    h, q, kv, ffn = (
        shape.hidden_size,
        shape.num_heads * shape.head_dim,
        shape.num_kv_heads * shape.head_dim,
        (shape.intermediate_size),
    )
    shapes = {
        "attn_norm": (h,), "attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_output": (h, q),
        "ffn_norm": (h,), "ffn_gate": (ffn, h), "ffn_up": (ffn, h), "ffn_down": (h, ffn),
    }  # fmt: skip
    out: list[tuple[str, tuple[int, ...]]] = []
    for part in LAYER_PARTS:
        out.append((f"blk.{layer}.{part}.weight", shapes[part]))
        if shape.qkv_bias and part in ("attn_q", "attn_k", "attn_v"):
            out.append((f"blk.{layer}.{part}.bias", shapes[part][:1]))
    return out


def tensor_plan(shape: ModelShape, file_type: str) -> list[TensorSpec]:
    """Every tensor of a `shape` model in a `file_type` file, in the order a converter writes them."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"file type {file_type!r} is not supported; supported: {', '.join(FILE_TYPES)}")
    named: list[tuple[str, tuple[int, ...]]] = []
    if shape.rope_scaling is not None:
        named.append(("rope_freqs.weight", (shape.head_dim // 2,)))
    named.append(("token_embd.weight", (shape.vocab_size, shape.hidden_size)))
    for layer in range(shape.num_layers):
        named += layer_tensors(shape, layer)
    named.append(("output_norm.weight", (shape.hidden_size,)))
    if not shape.tie_word_embeddings:
        named.append(("output.weight", (shape.vocab_size, shape.hidden_size)))
    plan = []
    for name, dims in named:
        if len(dims) == 1:
            kind = T.F32
        else:
            kind = weight_type(name, dims[-1], file_type, shape.tie_word_embeddings, shape.num_layers)
        plan.append(TensorSpec(name, dims, kind))
    return plan
