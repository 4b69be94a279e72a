"""Time the quantized linear kernel against torch's fp32 and bf16 F.linear at SmolLM2-135M's shapes.

    python -m bench.tools.bench_quant_linear [--rows 1 4 16 32] [--threads 2] [--repeat 20]

Two measurements per row count:
- one matrix, [rows, 576] x [576, 1536] (an up projection), called back to back: the weights stay in cache;
- a decode step's linears: 30 layers of fused qkv, o, gate_up and down plus the tied LM head, every matrix a
  distinct copy (Q4_1 ~98 MB with a Q8_0 head; fp32 ~540 MB), so the weights stream from memory as in a real step.
The effective bandwidth is the weight bytes read per call over its time. Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from engine.native.quant_format import QuantType, QuantWeight
from engine.native.quant_linear import NativeQuantLinear, load_kernel

logger = logging.getLogger("bench_quant_linear")

HIDDEN, INTER, LAYERS, VOCAB, Q_SIZE, KV_SIZE = 576, 1536, 30, 49152, 576, 192
LAYER_SHAPES = [
    (Q_SIZE + 2 * KV_SIZE, HIDDEN),
    (HIDDEN, Q_SIZE),
    (2 * INTER, HIDDEN),
    (HIDDEN, INTER),
]  # (out, in)


def quantized(out_features: int, in_features: int, qtype: QuantType, seed: int) -> QuantWeight:
    """A random [out, in] weight in qtype blocks, quantized by gguf.quants (the fast numpy path)."""
    w = np.random.default_rng(seed).standard_normal((out_features, in_features), dtype=np.float32) * 0.05
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(int(qtype)))
    return QuantWeight(qtype, torch.from_numpy(raw), in_features)


def median_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one call; on a shared machine CPU time leaves out the time spent waiting."""
    fn()  # warm-up: builds, first-touch page faults
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def quant_call(kernel: NativeQuantLinear, x: torch.Tensor, w: QuantWeight, act_q8: bool) -> torch.Tensor:
    if x.shape[0] <= 16:
        return kernel.linear(x, w, None, act_q8=act_q8)
    return kernel.gemm(x, w, None)


def bench_one_matrix(kernel: NativeQuantLinear, rows: int, repeat: int) -> None:
    out_features, in_features = INTER, HIDDEN
    w_q = quantized(out_features, in_features, QuantType.Q4_1, seed=0)
    w32 = torch.randn(out_features, in_features) * 0.05
    w16 = w32.bfloat16()
    x = torch.randn(rows, in_features)
    cases = {
        "q4_1 kernel, q8 activations": (lambda: quant_call(kernel, x, w_q, True), w_q.blocks.numel()),
        "q4_1 kernel, fp32 activations": (lambda: quant_call(kernel, x, w_q, False), w_q.blocks.numel()),
        "fp32 F.linear": (lambda: F.linear(x, w32), w32.numel() * 4),
        "bf16 F.linear": (lambda: F.linear(x.bfloat16(), w16), w16.numel() * 2),
    }
    for name, (fn, num_bytes) in cases.items():
        seconds, cpu = median_seconds(fn, repeat * 20)
        logger.info(
            "one [%d, %d] x [%d, %d]  %-30s %8.1f us (cpu %8.1f us)  %6.1f GB/s",
            rows, in_features, in_features, out_features, name, seconds * 1e6, cpu * 1e6, num_bytes / seconds / 1e9,
        )  # fmt: skip


def bench_decode_step(kernel: NativeQuantLinear, rows: int, repeat: int, with_bf16: bool) -> None:
    shapes = [shape for _ in range(LAYERS) for shape in LAYER_SHAPES]
    quant = [quantized(o, i, QuantType.Q4_1, seed=n) for n, (o, i) in enumerate(shapes)]
    quant.append(quantized(VOCAB, HIDDEN, QuantType.Q8_0, seed=-1 % 2**31))
    fp32 = [torch.randn(w.shape) * 0.05 for w in quant]
    x = {i: torch.randn(rows, i) for i in (HIDDEN, INTER)}
    x16 = {i: v.bfloat16() for i, v in x.items()}
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "quant kernel, q8 activations": (
            lambda: [quant_call(kernel, x[w.in_features], w, True) for w in quant],
            sum(w.blocks.numel() for w in quant),
        ),
        "quant kernel, fp32 activations": (
            lambda: [quant_call(kernel, x[w.in_features], w, False) for w in quant],
            sum(w.blocks.numel() for w in quant),
        ),
        "fp32 F.linear": (
            lambda: [F.linear(x[w.shape[1]], w) for w in fp32],
            sum(w.numel() * 4 for w in fp32),
        ),
    }
    if with_bf16:
        bf16 = [w.bfloat16() for w in fp32]
        cases["bf16 F.linear"] = (
            lambda: [F.linear(x16[w.shape[1]], w) for w in bf16],
            sum(w.numel() * 2 for w in bf16),
        )
    for name, (fn, num_bytes) in cases.items():
        seconds, cpu = median_seconds(fn, repeat)
        logger.info(
            "decode step, %2d rows  %-30s %8.2f ms (cpu %8.2f ms)  %6.1f GB/s  (%.0f MB of weights)",
            rows, name, seconds * 1e3, cpu * 1e3, num_bytes / seconds / 1e9, num_bytes / 1e6,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--no-bf16-step", action="store_true", help="skip bf16 in the decode step (slow on AVX2)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    kernel = load_kernel()
    if kernel is None:
        raise SystemExit("the quantized linear kernel cannot be built here (no C compiler?)")
    logger.info("threads: %d", torch.get_num_threads())
    for rows in args.rows:
        bench_one_matrix(kernel, rows, args.repeat)
    for rows in args.rows:
        bench_decode_step(kernel, rows, args.repeat, with_bf16=not args.no_bf16_step)


if __name__ == "__main__":
    main()
