"""Owns the model and its paged KV cache: sizes the pool, prepares a step's flattened inputs, runs the forward."""

from __future__ import annotations

import logging
import math
import mmap
from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.outputs import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV pool; one block holds block_size tokens of K and V for every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def block_bytes(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem


def make_attention_backend(name: str):
    """The attention backend named by the resolved config."""
    if name == "triton":
        from engine.attention_triton import TritonAttentionBackend

        return TritonAttentionBackend()
    from engine.attention_torch import TorchAttentionBackend

    return TorchAttentionBackend()


class ModelRunner:
    """Runs one scheduled step: KV copies, input preparation, forward, logits for the sequences that sample."""

    def __init__(
        self, config: EngineConfig, model: torch.nn.Module, spec: KVCacheSpec, num_blocks: int
    ) -> None:
        self.config = config
        self.model = model
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = torch.device(config.device)
        self.backend = make_attention_backend(config.attention_backend)
        if self.device.type == "cpu" and hasattr(model, "use_cpu_fast_paths"):
            num_packed, fused = model.use_cpu_fast_paths()
            logger.info("CPU fast paths: %d prepacked linear weights, fused bf16 ops %s", num_packed, fused)
        # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        shape = (spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.kv_cache = zeros_on_huge_pages(shape, spec.dtype, self.device)
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(spec.num_layers)]
        logger.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB, %d tokens)",
            num_blocks,
            spec.block_size,
            num_blocks * spec.block_bytes / 2**20,
            num_blocks * spec.block_size,
        )

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Apply copy-on-write block copies to every layer before the step stores new K/V."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=self.device)
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    def prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the step into input ids, positions and attention metadata; rows of the tokens that sample."""
        block_size = self.spec.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        for item in out.scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, end))
            query_start.append(query_start[-1] + item.num_new_tokens)
            seq_lens.append(end)
            tables.append(table)
            if item.samples:
                sample_rows.append(query_start[-1] - 1)
        max_blocks = max(len(t) for t in tables)
        padded = [t + [0] * (max_blocks - len(t)) for t in tables]
        dev = self.device
        query_lens = tuple(b - a for a, b in zip(query_start, query_start[1:]))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=query_lens,
            seq_lens_cpu=tuple(seq_lens),
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos, meta, sample_rows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Run the step; float32 logits [num_sampling_seqs, vocab] in the order of out.scheduled's sampling items."""
        self.copy_blocks(out.block_copies)
        ids, pos, meta, sample_rows = self.prepare(out)
        self.backend.prepare(meta)
        hidden = self.model(ids, pos, self.kv_caches, meta, self.backend)
        if not sample_rows:
            return torch.empty(0, 0)
        rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return logits.float().cpu()


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros; on a Linux CPU, in anonymous memory advised to use transparent huge pages.

    Decode attention reads the pool at scattered block offsets in every layer; with 4 KiB pages that walk is
    TLB-bound (64 sequences x ~300 tokens, one core: 30 layers of decode attention 99 -> 77 ms). Torch's allocator
    only asks for huge pages when THP_MEM_ALLOC_ENABLE is set before its first allocation.
    """
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < 2**21 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    buffer.madvise(mmap.MADV_HUGEPAGE)
    flat = torch.frombuffer(buffer, dtype=torch.uint8)  # the tensor keeps the mapping alive
    # fault every page in now, as torch.zeros would: the kernel's zeroing (and compaction for huge pages) then
    # happens here instead of inside the first steps that touch each block (~1 s over a 64-request run)
    flat[:: mmap.PAGESIZE].zero_()
    return flat.view(dtype).view(shape)


def num_blocks_for_budget(
    config: EngineConfig, spec: KVCacheSpec, profile_peak_bytes: int | None = None
) -> int:
    """How many blocks the KV budget buys: an explicit byte budget, the CPU default, or GPU memory left over."""
    from engine.config import CPU_DEFAULT_KV_CACHE_BYTES

    if config.kv_cache_bytes is not None:
        budget = config.kv_cache_bytes
    elif config.device == "cpu":
        budget = CPU_DEFAULT_KV_CACHE_BYTES
    else:
        total = torch.cuda.get_device_properties(torch.device(config.device)).total_memory
        peak = profile_peak_bytes or 0
        budget = int(total * config.memory_utilization) - peak
        logger.info(
            "GPU memory: %.2f GiB total x %.2f utilisation - %.2f GiB peak (weights + activations) = %.2f GiB for KV",
            total / 2**30,
            config.memory_utilization,
            peak / 2**30,
            budget / 2**30,
        )
    return max(budget // spec.block_bytes, 0)
