"""The model shapes `bench make-gguf` writes: the real configs of the models people run, and a tiny one for tests."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1+ `rope_scaling` (type llama3): long wavelengths divided by `factor`, a smooth ramp between."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelShape:
    """One architecture's hyperparameters as its HF config.json states them."""

    name: str
    arch: str  # GGUF general.architecture: "llama" or "qwen2"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    qkv_bias: bool = False  # Qwen2's q/k/v projections carry biases
    rope_scaling: Llama3RopeScaling | None = None
    num_unused_tokens: int = 0  # embedding rows past the tokenizer's last token (Qwen2 pads its vocabulary)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_parameters(self) -> int:
        """Weights and biases, the embedding once when tied."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv + (h + 2 * kv if self.qkv_bias else 0)
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * layer + heads * self.vocab_size * h + h


SHAPES = {
    shape.name: shape
    for shape in (
        ModelShape(
            "llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, True, 500000.0, 1e-5, 131072,
            rope_scaling=Llama3RopeScaling(factor=32.0),
        ),
        ModelShape(
            "llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, True, 500000.0, 1e-5, 131072,
            rope_scaling=Llama3RopeScaling(factor=32.0),
        ),
        ModelShape(
            "llama-3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, False, 500000.0, 1e-5, 131072,
            rope_scaling=Llama3RopeScaling(factor=8.0),
        ),
        ModelShape("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, True, 1000000.0, 1e-6, 32768,
                   qkv_bias=True, num_unused_tokens=151936 - 151665),
        # tests and the llama-quantize comparison: hidden 512 so the K-quants apply, an intermediate width of
        # 1408 (no multiple of 256) so llama-quantize's Q5_0/Q5_1/Q8_0 fallbacks show, 8 layers so "use more bits"
        # picks some layers and not others
        ModelShape(
            "tiny", "llama", 512, 8, 8, 4, 1408, 4096, True, 500000.0, 1e-5, 8192,
            rope_scaling=Llama3RopeScaling(factor=32.0),
        ),
        ModelShape("tiny-qwen2", "qwen2", 512, 4, 8, 2, 1408, 4096, True, 1000000.0, 1e-6, 8192,
                   qkv_bias=True, num_unused_tokens=32),
    )
}  # fmt: skip


def rope_freq_factors(shape: ModelShape) -> list[float] | None:
    """The `rope_freqs` tensor a converter writes for Llama 3 scaling: one divisor per rotary frequency."""
    scaling = shape.rope_scaling
    if scaling is None:
        return None
    dim = shape.head_dim
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * shape.rope_theta ** (i / dim)
        if wavelen < high_wavelen:  # fast rotations: kept
            factors.append(1.0)
        elif wavelen > low_wavelen:  # slow ones: stretched by the full factor
            factors.append(scaling.factor)
        else:  # in between: interpolated
            smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
                scaling.high_freq_factor - scaling.low_freq_factor
            )
            factors.append(1 / ((1 - smooth) / scaling.factor + smooth))
    return factors
