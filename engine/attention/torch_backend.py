"""Paged attention on the CPU: decode through the compiled kernel or over gathered blocks, prefill per sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.core.utils import cdiv
from engine.native.attention import NativeDecode, load_kernel
from kernels.reference import dequantize_kv_ref, quantize_kv_ref

MAX_DECODE_GROUPS = 4
F16_MAX = torch.finfo(torch.float16).max  # an fp16 pool's rows saturate here (store_kv_f16 does the same)


def _as_pool_holds(x: torch.Tensor, pool_dtype: torch.dtype) -> torch.Tensor:
    """K or V rows as a float pool of `pool_dtype` holds them: themselves, or (an fp16 pool under fp32 rows)
    saturated and rounded as store_kv_f16 does."""
    return x if x.dtype == pool_dtype else x.clamp(-F16_MAX, F16_MAX).to(pool_dtype)


MIN_SPLIT_SAVING = 32  # padded blocks a length split must save (per layer) to pay for its extra kernel calls


def _additive(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where valid, -inf elsewhere: SDPA takes it as is, where a bool mask is converted in every call."""
    return torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill_(~valid, float("-inf"))


@dataclass
class _Prefill:
    """One sequence with more than one query token this step."""

    row_start: int
    row_end: int
    seq_len: int
    block_ids: torch.Tensor  # [num_blocks] int64 to gather its context
    # context precedes this step's tokens; if not, a float pool's context is this step's k/v as is
    cached: bool
    valid: torch.Tensor | None  # [query_len, seq_len] bool, True = attend; None: plain causal
    masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # additive, made at first use

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.valid is not None and dtype not in self.masks:
            self.masks[dtype] = _additive(self.valid, dtype)
        return self.masks.get(dtype)


@dataclass
class _DecodeGroup:
    """Single-token sequences of similar length, attended together over their gathered, padded blocks."""

    rows: torch.Tensor | None  # [n] int64 query rows; None: every row of the batch, in order
    block_ids: torch.Tensor  # [n * num_blocks] int64
    valid: torch.Tensor  # [n, 1, 1, num_blocks * block_size] bool, True = a real context position
    masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # additive, made at first use

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self.masks:
            self.masks[dtype] = _additive(self.valid, dtype)
        return self.masks[dtype]


@dataclass(frozen=True)
class _NativeInputs:
    """The decoding sequences of a step as the compiled kernel takes them."""

    rows: torch.Tensor  # [n] int32 query rows
    seq_lens: torch.Tensor  # [n] int32
    block_tables: torch.Tensor  # [n, max_blocks] int32, contiguous


@dataclass
class _StepPlan:
    """Per-step indices and masks shared by every layer."""

    meta: AttentionMetadata
    block_size: int
    decodes: list[int]  # the sequences with one query token
    prefills: tuple[_Prefill, ...]
    native: _NativeInputs | None  # None: no decodes, or no kernel
    groups: tuple[_DecodeGroup, ...] | None = None  # the torch decode path, made at first use

    @property
    def decode_groups(self) -> tuple[_DecodeGroup, ...]:
        """The decoding sequences in length groups, each gathered and padded for SDPA."""
        if self.groups is None:
            self.groups = _group_decodes(self.meta, self.decodes, self.block_size)
        return self.groups


def split_by_length(lengths: list[int], max_groups: int, min_saving: int) -> list[int]:
    """Group boundaries over ascending `lengths` that cut padding (sum of size * longest) by greedy splits."""
    bounds = [0, len(lengths)]
    while len(bounds) - 1 < max_groups:
        best = (min_saving - 1, -1)  # (saving, split index)
        for start, end in pairwise(bounds):
            whole = (end - start) * lengths[end - 1]
            for i in range(start + 1, end):
                saving = whole - (i - start) * lengths[i - 1] - (end - i) * lengths[end - 1]
                best = max(best, (saving, i))
        if best[1] < 0:
            break
        bounds = sorted([*bounds, best[1]])
    return bounds


def _group_decodes(meta: AttentionMetadata, decodes: list[int], bs: int) -> tuple[_DecodeGroup, ...]:
    if not decodes:
        return ()
    starts = meta.query_start_loc.tolist()
    tables = meta.block_tables.to(torch.int64)
    blocks = [cdiv(meta.seq_lens_cpu[i], bs) for i in decodes]
    bounds = [0, len(decodes)]
    if max(blocks) - min(blocks) > 1:
        order = sorted(range(len(decodes)), key=blocks.__getitem__)
        bounds = split_by_length([blocks[j] for j in order], MAX_DECODE_GROUPS, MIN_SPLIT_SAVING)
        if len(bounds) > 2:
            decodes = [decodes[j] for j in order]
    in_order = len(bounds) == 2 and len(decodes) == meta.num_seqs
    return tuple(
        _decode_group(meta, tables, starts, decodes[start:end], bs, in_order)
        for start, end in pairwise(bounds)
    )


def _decode_group(meta, tables, starts, seqs: list[int], bs: int, in_order: bool) -> _DecodeGroup:
    index = torch.tensor(seqs, dtype=torch.int64, device=tables.device)
    num_blocks = cdiv(max(meta.seq_lens_cpu[i] for i in seqs), bs)
    lens = torch.tensor([meta.seq_lens_cpu[i] for i in seqs], device=tables.device)
    valid = torch.arange(num_blocks * bs, device=tables.device)[None, :] < lens[:, None]
    rows = None if in_order else torch.tensor([starts[i] for i in seqs], device=tables.device)
    block_ids = tables[index, :num_blocks].reshape(-1)
    return _DecodeGroup(rows, block_ids, valid.view(len(seqs), 1, 1, -1))


@dataclass(frozen=True)
class _Gather:
    """Reads whole blocks of one layer's pool in the query dtype, dequantizing an int8 pool (an fp16 pool under fp32
    queries: converted)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    dtype: torch.dtype

    def __call__(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of these blocks, [len(block_ids), block_size, Hkv, D] each."""
        keys, values = self.k_cache.index_select(0, block_ids), self.v_cache.index_select(0, block_ids)
        if self.k_scale is None:
            return keys.to(self.dtype), values.to(self.dtype)
        return (
            dequantize_kv_ref(keys, self.k_scale.index_select(0, block_ids)).to(self.dtype),
            dequantize_kv_ref(values, self.v_scale.index_select(0, block_ids)).to(self.dtype),
        )


class TorchAttentionBackend:
    """CPU paged attention; the caches must hold finite values (allocate them with torch.zeros).

    Decode sequences go to the compiled kernel (engine.native.attention) when it is built and supports the dtype and
    shapes: it reads K/V in place through the block tables. An int8 pool is read dequantized, an fp16 pool under fp32
    queries converted; their prefills read even this step's K/V back from the pool, so a prompt attends to the same
    rounded values whether it is computed in one step, in chunks, or token by token after a preemption. Otherwise they are attended together in torch: their
    blocks are gathered into [n, L, Hkv, D] (padded to the longest context, masked) and fed to SDPA with
    grouped-query heads; very uneven lengths are split into a few groups. Prefill sequences run one SDPA call each,
    reading cached context through their block tables.
    """

    def __init__(self, block_size: int | None = None, native: bool | None = None) -> None:
        """`native`: None uses the compiled decode kernel when it builds, False never, True requires it."""
        self.block_size = block_size  # None: taken from the cache shape at the first forward
        self.kernel: NativeDecode | None = None if native is False else load_kernel()
        if native and self.kernel is None:
            raise RuntimeError("native CPU attention was required but could not be built (see the log)")
        self._plan: _StepPlan | None = None

    def prepare(self, meta: AttentionMetadata) -> None:
        """Build the step plan for `meta` (or, without a known block size, at the step's first forward)."""
        self._plan = None if self.block_size is None else self._make_plan(meta, self.block_size)

    def _make_plan(self, meta: AttentionMetadata, bs: int) -> _StepPlan:
        starts = meta.query_start_loc.tolist()
        tables = meta.block_tables
        device = tables.device
        prefills = []
        for i, query_len in enumerate(meta.query_lens_cpu):
            if query_len == 1:
                continue
            seq_len = meta.seq_lens_cpu[i]
            block_ids = tables[i, : cdiv(seq_len, bs)].to(torch.int64)
            cached, mask = seq_len != query_len, None
            if cached:
                rows = torch.arange(query_len, device=device)[:, None] + (seq_len - query_len)
                mask = torch.arange(seq_len, device=device)[None, :] <= rows
            prefills.append(_Prefill(starts[i], starts[i] + query_len, seq_len, block_ids, cached, mask))
        decodes = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        native = None
        if decodes and self.kernel is not None and device.type == "cpu":
            if len(decodes) == meta.num_seqs:  # the usual decode step: every row, in order
                rows = torch.arange(len(decodes), dtype=torch.int32)
                native = _NativeInputs(rows, meta.seq_lens.contiguous(), tables.contiguous())
            else:
                index = torch.tensor(decodes, dtype=torch.int64)
                rows = torch.tensor([starts[i] for i in decodes], dtype=torch.int32)
                native = _NativeInputs(rows, meta.seq_lens[index], tables[index].contiguous())
        return _StepPlan(meta, bs, decodes, tuple(prefills), native)

    def forward(
        self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale=None, v_scale=None
    ) -> torch.Tensor:
        """See AttentionBackend.forward."""
        block_size, num_kv_heads, head_dim = k_cache.shape[1:]
        quantized = k_cache.dtype == torch.int8
        if quantized != (k_scale is not None and v_scale is not None):
            raise RuntimeError(
                f"{k_cache.dtype} caches {'need' if quantized else 'take no'} k_scale and v_scale"
            )
        plan = self._plan
        if plan is None or plan.meta is not meta or plan.block_size != block_size:
            plan = self._plan = self._make_plan(meta, block_size)
        if self.kernel is not None:  # raw-pointer code follows the step's block ids and slots
            meta.check_pool(k_cache.shape[0], block_size)
        if self.kernel is not None and self.kernel.can_store(k, v, k_cache, v_cache):
            self.kernel.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        elif quantized:  # the twin: quantize, then scatter values and scales
            for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
                values, row_scales = quantize_kv_ref(x)
                cache.view(-1, num_kv_heads, head_dim).index_copy_(0, meta.slot_mapping, values)
                scales.view(-1, num_kv_heads).index_copy_(0, meta.slot_mapping, row_scales)
        else:
            for x, cache in ((k, k_cache), (v, v_cache)):
                cache.view(-1, num_kv_heads, head_dim).index_copy_(
                    0, meta.slot_mapping, _as_pool_holds(x, cache.dtype)
                )
        gather = _Gather(k_cache, v_cache, k_scale, v_scale, q.dtype)
        if plan.native is not None and self.kernel.supports(q, k_cache):
            n = plan.native
            if meta.max_seq_len > n.block_tables.shape[1] * block_size:
                raise RuntimeError(
                    f"block tables of {n.block_tables.shape[1]} blocks for {meta.max_seq_len} tokens"
                )
            out = q.new_empty(q.shape)
            self.kernel(q, k_cache, v_cache, n.rows, n.seq_lens, n.block_tables, out, scale, k_scale, v_scale)
        else:
            groups = plan.decode_groups
            if len(groups) == 1 and groups[0].rows is None:
                return self._decode(q, gather, groups[0], scale)
            out = q.new_empty(q.shape)
            for group in groups:
                out[group.rows] = self._decode(q[group.rows], gather, group, scale)
        for p in plan.prefills:
            out[p.row_start : p.row_end] = self._prefill(q, k, v, gather, p, scale)
        return out

    @staticmethod
    def _decode(q, gather: _Gather, group: _DecodeGroup, scale: float) -> torch.Tensor:
        num_seqs, num_heads, head_dim = q.shape  # [n, Hq, D]
        keys, values = gather(group.block_ids)  # [n * blocks, block_size, Hkv, D]
        keys = keys.view(num_seqs, -1, *keys.shape[2:])  # [n, L, Hkv, D]
        values = values.view(num_seqs, -1, *values.shape[2:])
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [n, Hq, 1, D]
            keys.transpose(1, 2),  # [n, Hkv, L, D]
            values.transpose(1, 2),
            attn_mask=group.mask(q.dtype),
            scale=scale,
            enable_gqa=True,
        )
        return out.view(num_seqs, num_heads, head_dim)

    @staticmethod
    def _prefill(q, k, v, gather: _Gather, p: _Prefill, scale: float) -> torch.Tensor:
        rows = slice(p.row_start, p.row_end)
        query = q[rows].transpose(0, 1).unsqueeze(0)  # [1, Hq, Lq, D]
        # all context is new: this step's K/V as a float pool holds them, not read back (an int8 pool's rounding
        # depends on the scales it stores: read back)
        if not p.cached and gather.k_scale is None:
            pool = gather.k_cache.dtype
            keys, values = (_as_pool_holds(x[rows], pool).to(q.dtype) for x in (k, v))  # [L, Hkv, D]
        else:
            keys, values = gather(p.block_ids)
            keys, values = keys.flatten(0, 1)[: p.seq_len], values.flatten(0, 1)[: p.seq_len]
        out = F.scaled_dot_product_attention(
            query,
            keys.transpose(0, 1).unsqueeze(0),  # [1, Hkv, L, D]
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=p.mask(q.dtype),
            is_causal=p.valid is None,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)  # [Lq, Hq, D]
