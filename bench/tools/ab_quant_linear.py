"""A/B two source trees' GGUF-block GEMV in one process: each tree's quant_linear.c built beside the other, their
calls alternated on the same weights, medians of each pass.

    python -m bench.tools.ab_quant_linear OLD_TREE NEW_TREE [--types Q4_K,Q6_K] [--rows 1 2 4 5 8] [--march native]
        [--shape 2048,8192]

(`git worktree add /tmp/old HEAD~1` makes OLD_TREE.) Separate processes on a 2-core VM drift ±30% between runs;
alternating in one process, the same tree against itself reads within ±5%, which is what a kernel change needs. The
weights: `--matrices` distinct [2048, 8192] matrices of random blocks (Llama-3.2-1B's down projection; `--shape OUT,IN`
for another), which stream from memory; a repacked type (Q4_K_R8) is its file type's blocks repacked by OLD_TREE.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.common.quant_weights import random_blocks
from engine.native.build import CFLAGS
from engine.native.quant_format import QuantType
from engine.native.quant_linear import NativeQuantLinear

OUT_FEATURES, IN_FEATURES = 2048, 8192


def build(tree: Path, march: str, out: Path) -> NativeQuantLinear:
    native = tree / "engine" / "native"
    cmd = [
        "cc",
        *CFLAGS,
        f"-march={march}",
        f"-I{native}",
        str(native / "quant_linear.c"),
        "-o",
        str(out),
        "-lm",
    ]
    subprocess.run(cmd, check=True)
    return NativeQuantLinear(ctypes.CDLL(str(out)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--types", default="Q4_K,Q6_K", help="GGUF types, comma-separated")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 5, 8])
    parser.add_argument("--matrices", type=int, default=24)
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--march", default="native")
    parser.add_argument("--shape", default=f"{OUT_FEATURES},{IN_FEATURES}", help="OUT,IN of each matrix")
    args = parser.parse_args()
    out_features, in_features = (int(n) for n in args.shape.split(","))
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {
            name: build(tree, args.march, Path(tmp) / f"{name}.so")
            for name, tree in (("old", args.old), ("new", args.new))
        }
        for qtype in (QuantType[t] for t in args.types.split(",")):
            weights = [
                random_blocks(qtype.file_type, out_features, in_features, seed=i)
                for i in range(args.matrices)
            ]
            if not qtype.in_files:
                weights = [kernels["old"].repack(w) for w in weights]
            size = sum(w.blocks.numel() for w in weights)
            for rows in args.rows:
                x = torch.randn(rows, in_features)
                seconds: dict[str, list[float]] = {"old": [], "new": []}
                for p in range(args.passes):
                    for name in ("old", "new") if p % 2 else ("new", "old"):
                        start = time.perf_counter()
                        for w in weights:
                            kernels[name].linear(x, w, None, act_q8=True)
                        seconds[name].append(time.perf_counter() - start)
                old, new = statistics.median(seconds["old"]), statistics.median(seconds["new"])
                print(
                    f"{qtype.name} rows {rows}: old {size / old / 1e9:5.1f} GB/s  new {size / new / 1e9:5.1f} GB/s  new/old speed {old / new:.2f}"
                )


if __name__ == "__main__":
    main()
