"""The machine's measured matmul throughput at a model's own shapes: the ceiling for tokens per second."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class LinearShape:
    """One weight matrix of the model: `count` copies of an [out_features, in_features] linear."""

    name: str
    in_features: int
    out_features: int
    count: int


def linear_shapes(hf_config: Any) -> list[LinearShape]:
    """The fused QKV, output, fused gate/up and down projections of every layer, plus the LM head."""
    hidden = int(hf_config.hidden_size)
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // num_heads)
    inter = int(hf_config.intermediate_size)
    layers = int(hf_config.num_hidden_layers)
    return [
        LinearShape("qkv", hidden, (num_heads + 2 * num_kv_heads) * head_dim, layers),
        LinearShape("o", num_heads * head_dim, hidden, layers),
        LinearShape("gate_up", hidden, 2 * inter, layers),
        LinearShape("down", inter, hidden, layers),
        LinearShape("lm_head", hidden, int(hf_config.vocab_size), 1),
    ]


def flops_per_token(shapes: list[LinearShape]) -> int:
    """Matmul FLOPs one token costs in the linears (2 per multiply-add; attention scores excluded)."""
    return sum(2 * s.in_features * s.out_features * s.count for s in shapes)


@dataclass(frozen=True)
class MatmulResult:
    """Measured FLOP/s of the model's linears at `rows` rows, and the token rate that implies."""

    rows: int
    dtype: str
    flops_per_s: float
    flops_per_token: int
    seconds: float

    @property
    def ceiling_tokens_per_s(self) -> float:
        return self.flops_per_s / self.flops_per_token

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "rows": self.rows,
            "dtype": self.dtype,
            "gflops_per_s": self.flops_per_s / 1e9,
            "flops_per_token": self.flops_per_token,
            "ceiling_tokens_per_s": self.ceiling_tokens_per_s,
            "seconds": self.seconds,
        }


@torch.inference_mode()
def measure_matmul(
    shapes: list[LinearShape],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    rows: int = 64,
    min_seconds: float = 1.0,
    seed: int = 0,
) -> MatmulResult:
    """Time x @ W.T over every distinct weight of the model (all layers, so weights stream as in a forward).

    The linears are the engine's own (`engine.native.onednn.Linear`), prepacked for oneDNN where the engine
    prepacks them (bf16 on CPU), so the ceiling is that of the fastest matmul path the engine has.
    """
    from engine.native.onednn import Linear

    gen = torch.Generator().manual_seed(seed)
    linears = []
    for s in shapes:
        for _ in range(s.count):
            linear = Linear(s.in_features, s.out_features, bias=False, device="meta")
            w = torch.randn(s.out_features, s.in_features, generator=gen) * 0.02
            linear.weight = torch.nn.Parameter(w.to(device=device, dtype=dtype), requires_grad=False)
            linear.pack()
            linears.append(linear)
    inputs = {
        s.in_features: torch.randn(rows, s.in_features, generator=gen).to(device=device, dtype=dtype)
        for s in shapes
    }
    pass_flops = flops_per_token(shapes) * rows

    def one_pass() -> None:
        for linear in linears:
            linear(inputs[linear.in_features])

    one_pass()  # warm-up: first-touch allocation and kernel selection
    _sync(device)
    num_passes, start = 0, time.perf_counter()
    while True:
        one_pass()
        num_passes += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and num_passes >= 2:
            break
    return MatmulResult(
        rows=rows,
        dtype=str(dtype).removeprefix("torch."),
        flops_per_s=pass_flops * num_passes / elapsed,
        flops_per_token=flops_per_token(shapes),
        seconds=elapsed,
    )


def _sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
