"""Stream the int8 GEMV over weights larger than cache: Q4_K, its 8-row repacking Q4_K_R8, Q5_K and Q6_K against Q4_0
(Q4_K's bytes per weight).

    python -m bench.tools.bench_kquant_gemv [--matrices 48] [--rows 1 2 5 16] [--threads 1 2] [--repeat 4]

`--matrices` distinct [2048, 8192] weights (Llama-3.2-1B's down projection; 9.4 MB each in Q4_0 or Q4_K) are
multiplied in turn, the formats interleaved call by call, so each call streams its weight from memory. A matrix's
time is its fastest call over --repeat passes (on a shared machine the others are preempted ones); GB/s is the
weight bytes over the sum of those times.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from bench.common.quant_weights import random_blocks
from engine.native.quant_format import QuantType, QuantWeight
from engine.native.quant_linear import NativeQuantLinear, load_kernel

logger = logging.getLogger("bench_kquant_gemv")

OUT_FEATURES, IN_FEATURES = 2048, 8192
TYPES = (QuantType.Q4_0, QuantType.Q4_K, QuantType.Q4_K_R8, QuantType.Q5_K, QuantType.Q6_K)


def random_weight(qtype: QuantType, seed: int) -> QuantWeight:
    """One [OUT_FEATURES, IN_FEATURES] matrix of random blocks."""
    return random_blocks(qtype, OUT_FEATURES, IN_FEATURES, seed)


def stream(
    kernel: NativeQuantLinear, weights: dict[QuantType, list[QuantWeight]], rows: int, repeat: int
) -> dict:
    """GB/s of each format's GEMV over its matrices (fastest call per matrix)."""
    x = torch.randn(rows, IN_FEATURES)
    count = len(next(iter(weights.values())))
    best = {qtype: [float("inf")] * count for qtype in weights}
    for _ in range(repeat):
        for i in range(count):
            for qtype, ws in weights.items():
                start = time.perf_counter()
                kernel.linear(x, ws[i], None, act_q8=True)
                best[qtype][i] = min(best[qtype][i], time.perf_counter() - start)
    return {q: sum(w.blocks.numel() for w in ws) / sum(best[q]) / 1e9 for q, ws in weights.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=48)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument(
        "--march", default="native", help="instruction set to build for (x86-64-v3: AVX2 only)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kernel = load_kernel(args.march)
    if kernel is None:
        raise SystemExit("the quantized linear kernel cannot be built here (no C compiler?)")
    weights = {
        q: [random_weight(q, seed=100 * int(q) + i) for i in range(args.matrices)]
        for q in TYPES
        if q.in_files
    }
    weights[QuantType.Q4_K_R8] = [
        kernel.repack(random_weight(QuantType.Q4_K, seed=7 + i)) for i in range(args.matrices)
    ]
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            gbs = stream(kernel, weights, rows, args.repeat)
            logger.info(
                "%s threads %d rows %2d: %s  Q4_K/Q4_0 %.2f", args.march, threads, rows,
                "  ".join(f"{q.name} {v:6.2f} GB/s" for q, v in gbs.items()), gbs[QuantType.Q4_K] / gbs[QuantType.Q4_0],
            )  # fmt: skip


if __name__ == "__main__":
    main()
