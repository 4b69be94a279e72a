"""`bench step`: where a decode step's time goes, at a few batch sizes: the linears (matmuls), attention, and the
rest (norms, RoPE, activations, sampling, step metadata, detokenization, Python).

The clock is the engine's own (engine/worker/step_clock.py, the one `--step-timing` uses in a served engine): each
linear module and the attention backend's forward wrapped with a timer (~0.2 µs each, ~150 a step), a linear's share
including its own Python call; the fused decode step times its own linears and attention (KV store included) in C. Sequences are all decoding while steps are timed.

The linears' rate (2 operations per weight and sequence a step, over their time) is set beside the cores' arithmetic
peak on the same threads (engine/native/peak.py: fp32 FMA and the int8 dot product the quantized kernels use), so a
step's matmul share reads as "how far from what this machine can compute", not only as milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

from bench.common.report import new_figure, positive_ints, print_report, without_disk_tier, write_results

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. Request {i}."
PARTS = ("matmul_ms", "attention_ms", "rest_ms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench step`."""
    parser.add_argument(
        "--batch-sizes", type=positive_ints, default=[1, 64], help="decoding sequences (default 1,64)"
    )
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per batch size")


def measure(engine: Any, batch_size: int, steps: int, clock: Any) -> dict[str, Any]:
    """Median step time and its parts over `steps` decode steps of `batch_size` sequences, and the linears' rate in
    operations a second (the clock counts their weights)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch_size):
        prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT.format(i=i)}])
        engine.add_request(f"b{batch_size}-{i}", prompt, params)
    for _ in range(10_000):  # prefill (chunked) until every sequence has produced a token
        outputs = engine.step()
        if len(outputs) == batch_size and all(o.outputs[0].token_ids for o in outputs):
            break
    rows = []
    for _ in range(steps):
        clock.reset()
        start = time.perf_counter()
        outputs = engine.step()
        total = time.perf_counter() - start
        if len(outputs) != batch_size:  # a sequence finished or was preempted: not a full decode step
            break
        rows.append((total, *clock.read()))
    while engine.has_unfinished_requests():
        engine.step()
    if not rows:
        raise RuntimeError(f"no full decode step at batch size {batch_size}: is the KV pool big enough?")
    step_ms = 1000 * statistics.median(r[0] for r in rows)
    matmul_ms = 1000 * statistics.median(r[1] for r in rows)
    attention_ms = 1000 * statistics.median(r[2] for r in rows)
    return {
        "batch_size": batch_size,
        "steps_timed": len(rows),
        "step_ms": step_ms,
        "matmul_ms": matmul_ms,
        "attention_ms": attention_ms,
        "rest_ms": max(0.0, step_ms - matmul_ms - attention_ms),
        "tokens_per_s": 1000 * batch_size / step_ms,
        "matmul_gops": 2 * clock.linear_weights * batch_size / (matmul_ms / 1000) / 1e9
        if matmul_ms > 0
        else 0.0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time decode steps at each batch size; print, write JSON + PNG."""
    import torch

    from engine import LLM
    from engine.native.peak import measure_peak
    from engine.worker.step_clock import StepClock

    llm = LLM(**dataclasses.asdict(without_disk_tier(args.engine_config)))
    engine = llm.engine
    clock = StepClock(engine.runner)
    points = [measure(engine, b, args.steps, clock) for b in args.batch_sizes]
    peak = measure_peak(torch.get_num_threads()) if engine.runner.device.type == "cpu" else None
    resolved = engine.config
    payload = {
        "model": resolved.model,
        "config": {
            "quantization": resolved.quantization,
            "int8_activations": resolved.int8_activations,
            "dtype": resolved.dtype,
            "device": resolved.device,
            "attention_backend": resolved.attention_backend,
            "fused_decode": engine.runner.fused is not None,
        },
        "workload": {"prompt": PROMPT, "steps": args.steps, "temperature": 0.0},
        "linear_weights": clock.linear_weights,
        "compute_peak": dataclasses.asdict(peak) if peak is not None else None,
        "points": points,
        "targets": [],
    }
    paths = write_results("step", payload, _plot(points), args.results_dir, args.command_line)
    headers = ["batch", "step ms", "matmul ms", "attention ms", "rest ms", "tok/s", "matmul GOP/s"]
    rows = [
        [p["batch_size"], p["step_ms"], p["matmul_ms"], p["attention_ms"], p["rest_ms"], p["tokens_per_s"]]
        + [p["matmul_gops"]]
        for p in points
    ]
    print_report(f"decode step ({resolved.quantization}, {resolved.dtype})", headers, rows, (), paths)
    if peak is not None:
        print(
            f"the cores' peak on {peak.threads} threads: fp32 FMA {peak.fp32_gflops:.0f} GFLOP/s, "
            f"int8 dot product {peak.int8_gops:.0f} GOP/s (engine/native/peak.c)"
        )
    return payload


def _plot(points: list[dict[str, Any]]):
    fig, (ax,) = new_figure()
    labels = [str(p["batch_size"]) for p in points]
    bottom = [0.0] * len(points)
    for part in PARTS:
        values = [p[part] for p in points]
        ax.bar(labels, values, bottom=bottom, label=part.removesuffix("_ms"))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("decoding sequences")
    ax.set_ylabel("ms per step")
    ax.set_title("decode step breakdown")
    ax.legend(fontsize=8)
    return fig
