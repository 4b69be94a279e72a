"""The paged KV pool: its shape, how many blocks a byte budget buys, and its memory (huge pages on a CPU)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.attention.backend import LayerKV
from engine.core.config import EngineConfig
from engine.core.memory import (
    available_memory_bytes,
    kv_budget_line,
    kv_memory_budget,
)

SCALE_DTYPE = torch.float16  # an int8 pool's scale per token and KV head

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV pool; one block holds block_size tokens of K and V for every layer.

    `dtype` is the model's activation dtype. With kv_cache_dtype "int8" the pool holds int8 values and, beside them,
    one fp16 scale per token and KV head (kernels/reference.py's quantize_kv_ref): head_dim + 2 bytes a row; with
    "float16" fp16 values (2 bytes each); "auto" (as resolved) and "model" hold the model's dtype.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"

    @property
    def quantized(self) -> bool:
        return self.kv_cache_dtype == "int8"

    @property
    def cache_dtype(self) -> torch.dtype:
        """The element dtype of the pool's K/V values."""
        if self.kv_cache_dtype == "float16":
            return torch.float16
        return torch.int8 if self.quantized else self.dtype

    @property
    def dtype_name(self) -> str:
        """What the pool stores, as the admin page and /metrics name it: int8, bfloat16, float32..."""
        return str(self.cache_dtype).removeprefix("torch.")

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's K (or V) for one KV head: its values, and its scale when quantized."""
        return self.head_dim * self.cache_dtype.itemsize + (SCALE_DTYPE.itemsize if self.quantized else 0)

    @property
    def block_bytes(self) -> int:
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.row_bytes

    def allocate(
        self, num_blocks: int, device: torch.device, zeros=torch.zeros
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pool's values [num_layers, 2, num_blocks, block_size, Hkv, D] and, when quantized, its fp16 scales
        [num_layers, 2, num_blocks, block_size, Hkv] (else None), zero-filled by `zeros(shape, dtype, device)`."""
        shape = (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        values = zeros(shape, dtype=self.cache_dtype, device=device)
        scales = zeros(shape[:-1], dtype=SCALE_DTYPE, device=device) if self.quantized else None
        return values, scales

    @staticmethod
    def layers(values: torch.Tensor, scales: torch.Tensor | None) -> list[LayerKV]:
        """Per-layer views of a pool made by `allocate`."""
        return [
            LayerKV(values[i, 0], values[i, 1], *((scales[i, 0], scales[i, 1]) if scales is not None else ()))
            for i in range(values.shape[0])
        ]


def num_blocks_for_budget(
    config: EngineConfig,
    spec: KVCacheSpec,
    profile_peak_bytes: int | None = None,
    *,
    hold_one: bool = True,
    draft_block_bytes: int = 0,
) -> int:
    """How many blocks the KV budget buys: an explicit byte budget, the CPU default (`kv_memory_budget`, from the
    memory available now, after the weights; `hold_one`: at least one max_model_len sequence), or GPU memory left
    over. With a draft model (`draft_block_bytes`: one of its blocks) the budget pays for a block of each pool
    alike: the draft's pool holds as many tokens as the target's, out of the same budget."""
    block_bytes = spec.block_bytes + draft_block_bytes
    if config.kv_cache_bytes is not None:
        budget = config.kv_cache_bytes
    elif config.device == "cpu":
        budget = default_cpu_budget(config, spec, hold_one=hold_one, block_bytes=block_bytes)
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
    return max(budget // block_bytes, 0)


def default_cpu_budget(
    config: EngineConfig, spec: KVCacheSpec, *, hold_one: bool = True, block_bytes: int | None = None
) -> int:
    """`kv_memory_budget` for this model (one max_model_len sequence's blocks, of `block_bytes` each: the spec's, or
    with a draft model's beside it) and the memory available now, after the weights; logged with the rule that gave
    it."""
    assert config.max_model_len is not None, "the config is resolved"
    sequence_bytes = -(-config.max_model_len // spec.block_size) * (block_bytes or spec.block_bytes)
    available = available_memory_bytes()
    budget = kv_memory_budget(available, sequence_bytes, hold_one=hold_one)
    logger.info(kv_budget_line(budget, available, sequence_bytes, config.max_model_len, hold_one=hold_one))
    return budget
