"""The decoder layers of a decode step in one C call (engine/native/decode_step.c), for GGUF-quantized fp32 models
on the CPU.

`FusedDecoder.build` checks once that a model fits (every layer linear a QuantLinear, fp32 weights, fp32, fp16 or
int8 caches, the native kernels built) and gathers the pointers the C loop needs; `decode` then runs a decode-only step of up
to `QuantLinear.gemv_max_rows` sequences (with batch_gemm int8, whose GEMM is C as well, up to max_num_seqs) with one
crossing into C instead of ~300 Python calls; up to the GEMV bound it runs the LM head and each row's argmax too.
It calls the same kernels as the module path with the same arguments, so the two agree bit for bit
(tests/engine/test_fused_decode.py). Its inputs come as plain lists and go through persistent buffers, so a step
makes no torch call before the C call, and a greedy one none after it.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.attention.metadata import check_reach
from engine.models.llama import LlamaForCausalLM
from engine.models.quantized import QuantEmbedding
from engine.native import attention, fused_ops, quant_linear
from engine.native.attention import load_kernel as load_attention
from engine.native.build import load_library
from engine.native.fused_ops import load_cpu_ops
from engine.native.quant_linear import QuantLinear
from engine.native.quant_linear import load_kernel as load_quant_linear

if TYPE_CHECKING:
    from engine.attention.backend import LayerKV

logger = logging.getLogger(__name__)
SOURCE = Path(attention.SOURCE).with_name("decode_step.c")
_i32, _i64, _f32, _ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


MAX_SEGMENTS = 3  # decode_step.c's: a fused linear's formats (q, k, v each its own at most)


class _QSegment(ctypes.Structure):
    _fields_ = [("blocks", _ptr), ("row_bytes", _i64), ("qtype", _i32), ("out_features", _i32)]


class _QLinear(ctypes.Structure):
    _fields_ = [
        ("segments", _QSegment * MAX_SEGMENTS),
        ("num_segments", _i32),
        ("out_features", _i32),
        ("in_features", _i32),
        ("bias", _ptr),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("input_norm", _ptr),
        ("post_norm", _ptr),
        ("qkv", _QLinear),
        ("o", _QLinear),
        ("gate_up", _QLinear),
        ("down", _QLinear),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
        ("k_scale", _ptr),
        ("v_scale", _ptr),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("linear", _ptr),
        ("gemm", _ptr),
        ("gemm_min_rows", _i32),
        *[(name, _ptr) for name in ("norm", "silu", "rope", "store", "store_q8", "store_f16", "attend")],
        *[
            (name, _i32)
            for name in (
                "num_layers",
                "hidden",
                "intermediate",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "block_size",
                "act_q8",
                "kv_format",
            )
        ],  # fmt: skip
        ("eps", _f32),
        ("scale", _f32),
        ("c_block", _i64),
        ("c_tok", _i64),
        ("c_head", _i64),
        ("s_block", _i64),
        ("s_tok", _i64),
        ("rope_table", _ptr),
        ("rope_row", _i64),
        ("final_norm", _ptr),
        ("layers", ctypes.POINTER(_Layer)),
        ("head", _QLinear),
        ("argmax", _ptr),
        ("embed", _ptr),
        ("vocab", _i64),
        ("embed_blocks", _ptr),
        ("embed_row_bytes", _i64),
        ("embed_qtype", _i32),
        ("gather", _ptr),
    ]


@dataclass(frozen=True)
class FusedStep:
    """What a fused decode step computed: views into buffers that the next step overwrites."""

    hidden: torch.Tensor  # [n, hidden], final-normed
    # [n, vocab] fp32 when the step ran the LM head too (see FusedDecoder.head_rows)
    logits: torch.Tensor | None
    # with logits: each row's first maximum (a NaN counts as the maximum), as torch.argmax
    argmax: list[int] | None


def _fn_address(source: Path, name: str) -> int:
    """The address of function `name` in the loaded library built from `source` (already loaded: cached)."""
    lib = load_library(source)
    assert lib is not None, f"{source.name} is not built"
    return ctypes.cast(getattr(lib, name), _ptr).value


def _fusable_head(model: LlamaForCausalLM) -> QuantLinear | None:
    """The LM head, when it is a QuantLinear that runs as the layers' linears do (the C step then calls the very
    kernel its forward calls, so its logits are the module path's bit for bit), else None."""
    head, qkv = model.lm_head, model.layers[0].self_attn.qkv_proj
    if not isinstance(head, QuantLinear) or head.kernel is None or head.act_q8 != qkv.act_q8:
        return None
    if head.bias is not None and head.bias.dtype != torch.float32:
        return None
    return head


def _qlinear(module: QuantLinear) -> _QLinear:
    segments = module.segments
    assert len(segments) <= MAX_SEGMENTS, f"{len(segments)} segments (the C step takes {MAX_SEGMENTS})"
    parts = [
        _QSegment(s.blocks.data_ptr(), s.blocks.shape[1], int(s.qtype), s.out_features) for s in segments
    ]
    bias = module.bias
    return _QLinear(
        (_QSegment * MAX_SEGMENTS)(*parts),
        len(parts),
        module.out_features,
        module.in_features,
        None if bias is None else bias.data_ptr(),
    )


def _embedding_fields(model: LlamaForCausalLM) -> tuple:
    """The Model struct's embed .. gather fields: the fp32 table, or (a QuantEmbedding) its blocks and the gather
    that QuantEmbedding.forward calls."""
    embed = model.embed_tokens
    if isinstance(embed, QuantEmbedding):
        blocks = embed.blocks
        gather = _fn_address(quant_linear.SOURCE, "dequantize_gather")
        return None, embed.num_embeddings, blocks.data_ptr(), blocks.shape[1], embed.qtype, gather
    return embed.weight.data_ptr(), embed.weight.shape[0], None, 0, 0, None


class FusedDecoder:
    """Runs every decoder layer of a decode-only step in C; see the module docstring."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[LayerKV],
        lib: ctypes.CDLL,
        max_blocks_per_seq: int,
        max_seqs: int,
    ) -> None:
        args = model.args
        k0, s0 = kv_caches[0].k, kv_caches[0].k_scale
        self.model = model
        qkv = model.layers[0].self_attn.qkv_proj
        # the sequences a step may have: any number with batch_gemm int8, whose GEMM is C too (more rows than the
        # GEMV bound take it, as in QuantLinear.forward); else the GEMV bound (16)
        gemm = _fn_address(quant_linear.SOURCE, "quant_gemm_q8") if qkv.batch_gemm == "int8" else None
        self.max_rows = max(max_seqs, qkv.gemv_max_rows) if gemm is not None else qkv.gemv_max_rows
        self._kv_caches = kv_caches  # kept alive: the struct holds their pointers
        self.num_blocks, self.block_size = k0.shape[0], k0.shape[1]
        layers = []
        for layer, (k_cache, v_cache, k_scale, v_scale) in zip(model.layers, kv_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            layers.append(
                _Layer(
                    layer.input_layernorm.weight.data_ptr(),
                    layer.post_attention_layernorm.weight.data_ptr(),
                    _qlinear(attn.qkv_proj),
                    _qlinear(attn.o_proj),
                    _qlinear(mlp.gate_up_proj),
                    _qlinear(mlp.down_proj),
                    k_cache.data_ptr(),
                    v_cache.data_ptr(),
                    None if k_scale is None else k_scale.data_ptr(),
                    None if v_scale is None else v_scale.data_ptr(),
                )
            )
        self._layers = (_Layer * len(layers))(*layers)
        head = _fusable_head(model)
        # steps of up to head_rows sequences run the LM head and greedy's argmax in the same call: rows that both the
        # head's QuantLinear.forward and this loop (the layers' bound) give to the GEMV kernel; more leave the head
        # to the module
        self.head_rows = min(head.gemv_max_rows, qkv.gemv_max_rows) if head is not None else 0
        self._struct = _Model(
            _fn_address(quant_linear.SOURCE, "quant_linear"),
            gemm,
            qkv.gemv_max_rows + 1,
            _fn_address(fused_ops.SOURCE, "add_rms_norm_f32"),
            _fn_address(fused_ops.SOURCE, "silu_mul_f32"),
            _fn_address(fused_ops.SOURCE, "rope_f32"),
            _fn_address(attention.SOURCE, "store_kv"),
            _fn_address(attention.SOURCE, "store_kv_int8"),
            _fn_address(attention.SOURCE, "store_kv_f16"),
            _fn_address(attention.SOURCE, "paged_decode"),
            args.num_layers,
            args.hidden_size,
            args.intermediate_size,
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            self.block_size,
            int(model.layers[0].self_attn.qkv_proj.act_q8),
            attention.kv_format(k0.dtype, torch.float32),
            model.layers[0].input_layernorm.eps,
            model.layers[0].self_attn.scale,
            k0.stride(0),
            k0.stride(1),
            k0.stride(2),
            0 if s0 is None else s0.stride(0),
            0 if s0 is None else s0.stride(1),
            model.rope_cache.data_ptr(),
            model.rope_cache.stride(0),
            model.norm.weight.data_ptr(),
            self._layers,
            _qlinear(head) if head is not None else _QLinear(),
            _fn_address(fused_ops.SOURCE, "argmax_rows_f32"),
            *_embedding_fields(model),
        )
        self._fn = lib.decode_layers
        self._fn.restype = _i32
        # model, ids, residual, out, n, positions, slots, rows, seq_lens, tables, t_row, threads, seconds, logits,
        # argmax
        self._fn.argtypes = [_ptr, _ptr, _ptr, _ptr, _i32, *[_ptr] * 5, _i64, _i32, *[_ptr] * 3]
        # seconds spent in the layers' linears and attention since the last reset (read by `bench step`)
        self.seconds = (ctypes.c_double * 2)()
        self._struct_ptr = ctypes.addressof(self._struct)
        self._inputs = _DecodeInputs(model, self.max_rows, max_blocks_per_seq, self.head_rows)

    @classmethod
    def build(
        cls, model: torch.nn.Module, kv_caches: list[LayerKV], max_blocks_per_seq: int, max_seqs: int
    ) -> FusedDecoder | None:
        """A decoder for `model` whose steps have up to `max_seqs` sequences with block tables of up to
        `max_blocks_per_seq` blocks, or None (with the reason logged) when the model or machine does not fit."""
        reason = _unsupported(model, kv_caches)
        lib = None if reason else load_library(SOURCE)
        if reason is None and lib is None:
            reason = "decode_step.c could not be built"
        if reason is not None:
            logger.info("fused decode step off: %s", reason)
            return None
        return cls(model, kv_caches, lib, max_blocks_per_seq, max_seqs)  # type: ignore[arg-type]

    def decode(
        self, token_ids: list[int], positions: list[int], tables: list[list[int]], logits: bool = True
    ) -> FusedStep | None:
        """A decode-only step of sequences given as plain lists (each one new token at `positions[i]` with block
        table `tables[i]`), filled into persistent buffers: no torch call before the C step, nor a numpy one (the
        embedding gather is in C). Such a call may give the GIL up, and in a served engine the event loop then takes
        it for its whole turn (~0.7 ms at one stream) while this thread waits; the C call gives it up too, and there
        the turn overlaps the layers. With `logits` and up to `head_rows` sequences the same call runs the LM head
        and each row's argmax (greedy's token), so a greedy step needs no torch call at all. Returns views into
        buffers the next call overwrites, or None when the step is not one this step takes (more than `max_rows`
        sequences, a table past `max_blocks_per_seq`): the module path runs it."""
        inputs = self._inputs
        n = len(token_ids)
        if not 0 < n <= self.max_rows:
            return None
        bs = self.block_size
        max_block = max_slot = 0
        for i, (token, pos, table) in enumerate(zip(token_ids, positions, tables, strict=True)):
            if len(table) > inputs.width or pos // bs >= len(table):
                return None
            slot = table[pos // bs] * bs + pos % bs
            inputs.ids[i], inputs.positions[i] = token, pos
            inputs.slots[i], inputs.seq_lens[i] = slot, pos + 1
            inputs.tables[i, : len(table)] = table
            max_block, max_slot = max(max_block, max(table)), max(max_slot, slot)
        check_reach(max_block, max_slot, self.num_blocks, bs, "the decode step")  # C follows them unchecked
        head = logits and n <= self.head_rows
        status = self._fn(
            self._struct_ptr,
            *inputs.pointers,
            n,
            *inputs.pointers_after_n,
            inputs.width,
            inputs.threads,
            self.seconds,
            *(inputs.head_pointers if head else (None, None)),
        )
        if status != 0:
            raise RuntimeError(f"decode_layers failed (status {status})")
        if not head:
            return FusedStep(inputs.out_views[n], None, None)
        return FusedStep(inputs.out_views[n], inputs.logits_views[n], inputs.argmax[:n].tolist())


class _DecodeInputs:
    """Persistent host buffers of `FusedDecoder.decode` (numpy, so filling them calls no torch function) and the
    raw pointers the C step takes, computed once."""

    def __init__(self, model: LlamaForCausalLM, max_rows: int, width: int, head_rows: int) -> None:
        hidden = model.args.hidden_size
        self.width = width
        self.ids = np.zeros(max_rows, np.int64)
        self.positions = np.zeros(max_rows, np.int64)
        self.slots = np.zeros(max_rows, np.int64)
        self.seq_lens = np.zeros(max_rows, np.int32)
        self.rows = np.arange(max_rows, dtype=np.int32)
        self.tables = np.zeros((max_rows, width), np.int32)
        self.residual = np.zeros((max_rows, hidden), np.float32)
        out = torch.zeros(max_rows, hidden)
        self.out_views = [out[:n] for n in range(max_rows + 1)]  # sliced once: no torch call per step
        self.threads = torch.get_num_threads()  # the engine sets its threads before it builds the runner
        self.pointers = (self.ids.ctypes.data, self.residual.ctypes.data, out.data_ptr())
        self.pointers_after_n = tuple(
            a.ctypes.data for a in (self.positions, self.slots, self.rows, self.seq_lens, self.tables)
        )
        logits = torch.zeros(head_rows, model.args.vocab_size)  # the head's output, for up to head_rows rows
        self.logits_views = [logits[:n] for n in range(head_rows + 1)]
        self.argmax = np.zeros(head_rows, np.int32)
        self.head_pointers = (logits.data_ptr(), self.argmax.ctypes.data)


def _unsupported(model: torch.nn.Module, kv_caches: list[LayerKV]) -> str | None:
    """Why the fused step cannot run this model, or None."""
    if not isinstance(model, LlamaForCausalLM):
        return f"{type(model).__name__} is not a LlamaForCausalLM"
    embed = model.embed_tokens
    if model.norm.weight.dtype != torch.float32 or model.norm.weight.device.type != "cpu":
        return "the model is not fp32 on the CPU"
    if isinstance(embed, QuantEmbedding):
        if embed.dtype != torch.float32:
            return "the token embedding's rows are not fp32"
    elif embed.weight.dtype != torch.float32 or not embed.weight.is_contiguous():  # gathered by pointer
        return "the token embedding table is not a contiguous fp32 one"
    if load_attention() is None or load_cpu_ops() is None or load_quant_linear() is None:
        return "a native kernel (attention, fused ops, quantized linear) is not built"
    for layer in model.layers:
        linears = (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        )
        if not all(isinstance(m, QuantLinear) for m in linears):
            return "its layer linears are not GGUF blocks (it needs --quantization gguf)"
        if any(m.bias is not None and m.bias.dtype != torch.float32 for m in linears):
            return "a linear bias is not fp32"
        if any(len(m.qtypes) > MAX_SEGMENTS for m in linears):
            return f"a linear has more than {MAX_SEGMENTS} block formats"
    k0, s0 = kv_caches[0].k, kv_caches[0].k_scale
    scaled = s0 is not None
    if k0.dtype not in (torch.float32, torch.float16, torch.int8) or (k0.dtype == torch.int8) != scaled:
        return "the KV caches are neither fp32, fp16 nor int8 with scales"
    if any(
        k.dtype != k0.dtype or k.stride() != k0.stride() or v.stride() != k0.stride()
        for k, v, *_ in kv_caches
    ):
        return "the KV caches do not share one dtype and layout"
    if s0 is not None and any(
        s.stride() != s0.stride() or s.stride(-1) != 1 for *_, ks, vs in kv_caches for s in (ks, vs)
    ):
        return "the KV scales do not share one layout"
    args = model.args
    if args.head_dim % 16 or not 16 <= args.head_dim <= 256 or args.num_heads // args.num_kv_heads > 16:
        return f"head_dim {args.head_dim} / GQA {args.num_heads // args.num_kv_heads} outside the attention kernel"
    if k0.stride(-1) != 1:
        return "the KV cache's head_dim is not unit stride"
    return None
