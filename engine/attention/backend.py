"""The attention backend protocol, and the choice of backend the resolved config names."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from engine.attention.metadata import AttentionMetadata


class LayerKV(NamedTuple):
    """One layer's view of the paged pool: K and V [num_blocks, block_size, Hkv, D] in the activation dtype, or int8
    with fp16 scales [num_blocks, block_size, Hkv] (kernels/reference.py's quantize_kv_ref)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


class AttentionBackend(Protocol):
    """Stores a step's K/V into the paged cache and attends each query over its sequence's context."""

    def prepare(self, meta: AttentionMetadata) -> None:
        """Precompute per-step state (gather indices, masks) once, before the layers run."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        k_scale: torch.Tensor | None = None,  # int8 caches: [num_blocks, block_size, Hkv] fp16
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Write k/v at meta.slot_mapping (quantized into int8 caches), then causal attention over cached + new
        context."""
        ...


def make_attention_backend(name: str) -> AttentionBackend:
    """The attention backend named by the resolved config: `triton` (CUDA kernels) or `torch` (CPU)."""
    if name == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    from engine.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()
