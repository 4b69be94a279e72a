"""Llama-family GGUF files read directly: tensors by HF name, quantized blocks kept where our kernels run them.

Every format of QuantType (Q4_0/Q4_1/Q8_0, Q5_0/Q5_1, IQ4_NL, the K-quants Q3_K..Q6_K, IQ4_XS) stays in its blocks
(`QuantWeight`) for the linears; F32/F16/BF16 tensors become torch tensors; a format without a block kernel (Q2_K)
is dequantized with gguf.quants, with a warning stating its cost (gguf_weights.py). `load_gguf_model` reads the file
without any float copy of a linear in blocks: the model is built on the meta device and only what stays float gets
storage (gguf_weights.py, gguf_read.py). llama.cpp's converter permutes the rows of llama's q/k projections so that
RoPE rotates adjacent pairs; the HF layout rotates halves, so those rows are moved back. Each row is whole blocks, so
the permutation moves blocks and never re-quantizes. The metadata -> config mapping is in gguf_config.py.
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

from engine.core.memory import human_bytes
from engine.loading import tokenizer_cache
from engine.loading.gguf_config import (
    PERMUTED_QK_ARCHITECTURES,
    gguf_architecture,
    gguf_field,
    gguf_hf_config,
)
from engine.loading.gguf_file import GGUFFile, read_gguf_file
from engine.loading.gguf_read import FileTensor, dequantize_into, file_tensors, read_float_into
from engine.loading.gguf_weights import (
    check_fits,
    float_copies,
    float_loads,
    linear_block_parts,
    read_linear_blocks,
    report_float_copies,
)
from engine.loading.memory import weight_memory
from engine.models.llama import LlamaForCausalLM, ModelArgs
from engine.models.quantized import (
    EMBEDDING,
    FILE_TYPES,
    QuantType,
    QuantWeight,
    fused_linear_sources,
    quantize_embedding,
    quantize_linears,
)

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("gguf", "none")  # keep the GGUF blocks in QuantLinear, or dequantize every weight to dtype
FLOAT_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = tuple(q.name for q in FILE_TYPES)  # kept in blocks with quantization "gguf"
DEQUANTIZED_TYPES = ("Q2_K",)  # no block kernel: dequantized to float, with a warning stating the cost
SUPPORTED_TENSOR_TYPES = FLOAT_TYPES + BLOCK_TYPES + DEQUANTIZED_TYPES
SKIPPED_TENSORS = ("rope_freqs.weight",)
# the tokenizer class AutoTokenizer chooses for a GGUF file of each architecture (tests/engine/test_gguf_loading.py)
TOKENIZER_CLASSES = {
    "llama": "TokenizersBackend",
    "qwen2": "Qwen2Tokenizer",
}  # read into the config (gguf_config.py), not a model weight

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
LINEAR_PARTS = frozenset(("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"))


def is_gguf_file(path: str | Path) -> bool:
    """Whether `path` names a GGUF file (by its suffix and its magic bytes)."""
    path = Path(path).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def open_gguf(path: str | Path) -> GGUFFile:
    """The file's metadata and tensor table (gguf_file.py: a fast parse; tensors are read when used)."""
    return read_gguf_file(path)


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


def layer_linears_in_blocks(reader: Any) -> bool:
    """True when every layer linear of the file is a format kept in blocks (so all of them run on our kernels)."""
    weights = [t for t in reader.tensors if _is_layer_linear_weight(t.name)]
    return bool(weights) and all(t.tensor_type.name in BLOCK_TYPES for t in weights)


def _is_layer_linear_weight(gguf_name: str) -> bool:
    parts = gguf_name.split(".")  # blk.<layer>.<part>.weight; a bias (Qwen2's q/k/v) is .bias and stays float
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in LINEAR_PARTS and parts[3] == "weight"


def check_tensor_types(reader: Any) -> None:
    """ValueError naming the first tensor whose format is not supported, and the supported ones."""
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
            raise ValueError(
                f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}"
            )


def read_tensor(tensor: Any, dtype: torch.dtype | None = None) -> torch.Tensor | QuantWeight:
    """One GGUF tensor through gguf-py's memory map: blocks kept for every QuantType, else a torch tensor (in `dtype`
    when given). The loader reads with gguf_read.py instead; this independent path is the tests' reference."""
    from gguf import GGMLQuantizationType, quants

    kind = tensor.tensor_type
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
    if int(kind) in {int(q) for q in FILE_TYPES}:
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8)).reshape(shape[0], -1)
        return QuantWeight(QuantType(int(kind)), blocks, shape[-1])
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        value = torch.from_numpy(np.array(tensor.data)).reshape(shape)
    elif kind == GGMLQuantizationType.BF16:
        value = torch.from_numpy(np.array(tensor.data).view(np.int16)).view(torch.bfloat16).reshape(shape)
    else:
        value = torch.from_numpy(quants.dequantize(tensor.data, kind)).reshape(shape)
    return value if dtype is None else value.to(dtype)


def iter_gguf_tensors(
    reader: Any, hf_config: Any, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """Every model tensor by HF name (floats in `dtype` when given), llama's q/k rows back in HF order."""
    heads = {"q_proj": hf_config.num_attention_heads, "k_proj": hf_config.num_key_value_heads}
    permuted = gguf_architecture(reader) in PERMUTED_QK_ARCHITECTURES
    for tensor in reader.tensors:
        if tensor.name in SKIPPED_TENSORS:
            continue
        name = hf_tensor_name(tensor.name)
        value = read_tensor(tensor, dtype)
        proj = name.split(".")[-2]
        if permuted and ".self_attn." in name and proj in heads:  # weights and biases alike
            rows = value.out_features if isinstance(value, QuantWeight) else value.shape[0]
            index = unpermute_index(rows, heads[proj])
            value = value.select_rows(index) if isinstance(value, QuantWeight) else value[index].contiguous()
        yield name, value


def log_tensor_formats(reader: Any, in_blocks: set[str], dtype: torch.dtype) -> dict[str, tuple[int, int]]:
    """One INFO line per tensor format: how many tensors stay in blocks and how many became `dtype`.

    Returns {format: (in blocks, in dtype)}."""
    counts: dict[str, list[int]] = {}
    for tensor in reader.tensors:
        if tensor.name in SKIPPED_TENSORS:
            continue
        kind = tensor.tensor_type.name
        counts.setdefault(kind, [0, 0])[hf_tensor_name(tensor.name) not in in_blocks] += 1
    for kind, (num_blocks, num_float) in sorted(counts.items()):
        if kind in DEQUANTIZED_TYPES:
            why = "dequantized: no block kernel for it"
        elif kind in FLOAT_TYPES:
            why = "float in the file"
        else:
            why = "quantization none, or a fused linear with a part in float"
        logger.info(
            "GGUF %s: %d tensors kept in blocks, %d loaded as %s%s",
            kind, num_blocks, num_float, dtype, f" ({why})" if num_float else "",
        )  # fmt: skip
    return {kind: (n[0], n[1]) for kind, n in counts.items()}


def load_gguf_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    *,
    quantization: str = "gguf",
    max_model_len: int | None = None,
    act_q8: bool = False,
    batch_gemm: str = "fp32",
    weight_layout: str = "file",
    reader: Any | None = None,
) -> tuple[LlamaForCausalLM, Any]:
    """The model of a GGUF file and its config (LlamaConfig or Qwen2Config); eval mode, no grad.

    quantization="gguf" keeps the linears (and a tied head) of every QuantType format in QuantLinear, CPU only: their
    blocks are read from the file straight into one buffer per (fused) linear and never exist in float; a linear in a
    format without a block kernel is dequantized with a WARNING stating its cost, and loading is refused
    (NotEnoughMemory) when the machine's available memory would not hold the weights. act_q8=True then
    quantizes decode activations to int8 per 32-block as llama.cpp does (see QuantLinear; the engine's default with
    gguf): on SmolLM2 the linears at one row take ~1.5x less time on an AVX2 machine, and logits move (`pagedchat
    bench quality`, mode gguf-int8act); act_q8=False multiplies fp32 activations exactly. batch_gemm: how batches of more than the GEMV bound multiply the blocks (fp32
    tiles, a bf16 copy, or the int8 GEMM: see QuantLinear). weight_layout "rows8": the linears' Q4_K blocks are
    repacked as they are read into groups of 8 interleaved rows (QuantType.Q4_K_R8; EngineConfig.weight_layout).
    "none" dequantizes every weight to dtype. Norms and biases are always loaded in dtype; with "gguf" an embedding
    in blocks stays in them (QuantEmbedding, shared with a tied head).
    `reader`: open_gguf(path) when the caller has it already (parsing the metadata takes seconds for a large vocab).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported; supported: {QUANTIZATIONS}")
    if quantization == "gguf" and torch.device(device).type != "cpu":
        raise ValueError(f"quantization='gguf' runs on the CPU only, not {device}; use quantization='none'")
    start = time.monotonic()
    reader = open_gguf(path) if reader is None else reader
    hf_config = gguf_hf_config(reader)
    check_tensor_types(reader)
    args = ModelArgs.from_hf_config(hf_config, max_model_len=max_model_len)
    with torch.device("meta"):  # no storage yet: only what stays float gets any (below)
        model = LlamaForCausalLM(args).to(dtype)
    tensors = {
        hf_tensor_name(t.name): t for t in file_tensors(reader).values() if t.name not in SKIPPED_TENSORS
    }
    orders = qk_row_orders(reader, hf_config, tensors)
    linear_names = {name for names in fused_linear_sources(model).values() for name in names}
    linears = {t.name for name, t in tensors.items() if name in linear_names}
    with open(Path(path).expanduser(), "rb") as file:
        in_blocks: set[str] = set()
        blocks: dict[str, QuantWeight] = {}
        if quantization == "gguf":
            groups = linear_block_parts(model, tensors)
            block_bytes = sum(tensors[n].nbytes for g in groups for n in g)
            check_fits(block_bytes, f"the {sum(map(len, groups))} weights in blocks")
            blocks = read_linear_blocks(
                file.fileno(), groups, tensors, orders, rows8=weight_layout == "rows8"
            )
            in_blocks = quantize_linears(model, blocks, act_q8=act_q8, batch_gemm=batch_gemm)
            if EMBEDDING in blocks:  # kept in blocks (shared with a tied head): no float copy of the table
                quantize_embedding(model, blocks[EMBEDDING])
                in_blocks.add(EMBEDDING)
        loads = float_loads(model, tensors, in_blocks)
        copies = float_copies(loads, dtype, linears)
        report_float_copies(copies, dtype, warn=quantization == "gguf")
        float_bytes = sum(load.nbytes(dtype) for load in loads)
        check_fits(
            float_bytes, f"the weights in float ({'; '.join(c.describe(dtype) for c in copies) or 'norms'})"
        )
        model.materialize(device)  # only the parameters still on the meta device: those of `loads`
        params = dict(model.named_parameters())
        with torch.no_grad():
            for load in loads:
                param = params[load.param]
                target = param if load.rows is None else param[load.offset : load.offset + load.rows]
                if load.hf_name in blocks:  # read in blocks already (a tied embedding, a linear not taken)
                    dequantize_into(blocks[load.hf_name], target)
                else:
                    read_float_into(file.fileno(), load.tensor, target, orders.get(load.hf_name))
    del blocks
    model.eval().requires_grad_(False)
    log_tensor_formats(reader, in_blocks, dtype)
    memory = weight_memory(model)
    logger.info(
        "loaded %s (%s, %s, quantization=%s: %d weights in blocks, %s; %s in float) in %.1f s",
        path, dtype, device, quantization, len(in_blocks), human_bytes(memory.blocks), human_bytes(memory.float),
        time.monotonic() - start,
    )  # fmt: skip
    return model, hf_config


def qk_row_orders(reader: Any, hf_config: Any, tensors: dict[str, FileTensor]) -> dict[str, torch.Tensor]:
    """HF name -> the file's row for each HF row, for llama's permuted q/k weights and biases."""
    if gguf_architecture(reader) not in PERMUTED_QK_ARCHITECTURES:
        return {}
    heads = {"q_proj": hf_config.num_attention_heads, "k_proj": hf_config.num_key_value_heads}
    orders = {}
    for name, tensor in tensors.items():
        proj = name.split(".")[-2]
        if ".self_attn." in name and proj in heads:
            orders[name] = unpermute_index(tensor.shape[0], heads[proj])
    return orders


def gguf_chat_template(reader: Any) -> str | None:
    """The chat template stored in the file's metadata, if any."""
    return gguf_field(reader, "tokenizer.chat_template", None)


def load_gguf_tokenizer(path: str | Path, reader: GGUFFile | None = None) -> Any:
    """The tokenizer (with its chat template) that transformers builds from the file's metadata: the class that
    AutoTokenizer picks for the architecture, built directly (AutoTokenizer first builds the file's model config,
    for llama/qwen2 with gguf.GGUFReader: 10-25 s for a 128k vocabulary)."""
    import transformers

    path = Path(path).expanduser().resolve()
    saved = tokenizer_cache.read_saved(path)  # built once per file (engine/loading/tokenizer_cache.py)
    if saved is not None:
        return saved
    arch = gguf_architecture(open_gguf(path) if reader is None else reader)
    tokenizer_class = getattr(transformers, TOKENIZER_CLASSES[arch])
    # from_pretrained(folder, gguf_file=...) also reads the folder's tokenizer_config.json, which then overrides the
    # file's chat template (the provisioned default-model folder keeps its GGUF beside such files): a folder of one
    with tempfile.TemporaryDirectory(prefix="pagedchat-gguf-") as alone:
        os.symlink(path, Path(alone) / path.name)
        tokenizer = tokenizer_class.from_pretrained(alone, gguf_file=path.name)
    tokenizer_cache.save(path, tokenizer)
    return tokenizer
