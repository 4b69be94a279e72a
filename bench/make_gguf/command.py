"""`bench make-gguf`: write a random-weight GGUF file of a real model's shape, laid out as llama-quantize lays out
the chosen file type, with a tokenizer of the model's vocabulary size: files to measure speed and memory on without
downloading anything (speed does not depend on the weights' values)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.make_gguf.blocks import tensor_nbytes
from bench.make_gguf.shapes import SHAPES
from bench.make_gguf.tensor_types import FILE_TYPES, tensor_plan
from bench.make_gguf.writer import write_gguf

HELP = "write a random-weight GGUF of a real model's shape (llama-quantize's tensor types, a real-size tokenizer)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench make-gguf`."""
    parser.add_argument(
        "--shape", choices=list(SHAPES), required=True, help="the model whose config is copied"
    )
    parser.add_argument(
        "--type", choices=list(FILE_TYPES), default="Q4_K_M", help="llama-quantize's file type"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the file to write (default ./SHAPE.TYPE.gguf)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and made-up merges")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the file; print where, how big and how long it took."""
    shape = SHAPES[args.shape]
    out = args.out or Path(f"{shape.name}.{args.type}.gguf")
    total = sum(tensor_nbytes(spec.type, spec.shape) for spec in tensor_plan(shape, args.type))
    bar = _progress(total)
    written = write_gguf(shape, args.type, out, seed=args.seed, on_tensor=lambda spec, n: bar(n))
    bar(0, close=True)
    print(
        f"{written.path}: {shape.name} in {args.type}, {written.num_bytes / 1e9:.3f} GB in {written.seconds:.1f} s"
    )
    for kind, (count, nbytes) in sorted(written.tensors_by_type.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:>5}: {count:4d} tensors, {nbytes / 1e6:10.1f} MB")
    return {
        "path": str(written.path),
        "bytes": written.num_bytes,
        "seconds": written.seconds,
        "tensors_by_type": written.tensors_by_type,
    }


def _progress(total: int):
    """A byte counter on stderr (tqdm where the bench extra is installed, else nothing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda n, close=False: None
    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="writing",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    )

    def update(n: int, close: bool = False) -> None:
        bar.update(n)
        if close:
            bar.close()

    return update
