"""What the model's weights take in memory, and the start-up line that reports it beside the KV pool."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.core.memory import WeightMemory, available_memory_bytes, human_bytes

logger = logging.getLogger(__name__)


def weight_memory(model: nn.Module) -> WeightMemory:
    """The model's weight bytes: uint8 buffers are quantized blocks, parameters are float; each storage counted once
    (a tied head, the rows of one fused buffer)."""
    seen: set[int] = set()
    blocks = floats = 0
    tensors = [(b, True) for b in model.buffers() if b.dtype == torch.uint8]
    tensors += [(p, False) for p in model.parameters()]
    for tensor, is_blocks in tensors:
        if tensor.is_meta:
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        if is_blocks:
            blocks += storage.nbytes()
        else:
            floats += storage.nbytes()
    return WeightMemory(blocks, floats)


def log_memory(weights: WeightMemory, kv_pool_bytes: int, num_blocks: int) -> None:
    """The start-up line: the weights' bytes (in blocks, in float), the KV pool's, the two together (what the process
    holds for them, both resident from the start) and what the machine has left."""
    available = available_memory_bytes()
    logger.info(
        "memory: weights %s (%s in blocks, %s in float) + KV pool %s (%d blocks) = %s; %s of the machine's "
        "memory left",
        human_bytes(weights.total), human_bytes(weights.blocks), human_bytes(weights.float),
        human_bytes(kv_pool_bytes), num_blocks, human_bytes(weights.total + kv_pool_bytes),
        "unknown" if available is None else human_bytes(available),
    )  # fmt: skip
