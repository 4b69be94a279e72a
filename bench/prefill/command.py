"""`bench prefill`: how fast the engine prefills `bench serving`'s prompts, split into the linears, attention and the
rest, beside the cores' int8 peak.

The prompts are `bench serving`'s chat requests (bench/common/workload.py, the same seed; its 64-stream point sends
128), prefilled offline with max_tokens 1 and prefix caching off, so every repeat computes every token, in steps of
max_num_batched_tokens. The step clock (engine/worker/step_clock.py, as `bench step` uses it) times every linear and
the attention backend. The layer linears' rate counts 2 operations a weight and prompt token over the matmul time,
which also holds the LM head of each prompt's last token; the peak is engine/native/peak.c's on the same threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from bench.common.report import new_figure, print_report, without_disk_tier, write_results
from bench.common.workload import chat_requests

PARTS = ("matmul_s", "attention_s", "rest_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench prefill`."""
    parser.add_argument(
        "--num-requests", type=int, default=128, help="prompts (default 128: what bench serving's c=64 sends)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes over the prompts; the best is kept"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Prefill the prompts `--repeats` times after a warm-up; print, write JSON + PNG of the best pass."""
    import torch

    from engine import LLM, SamplingParams
    from engine.native.peak import measure_peak
    from engine.worker.step_clock import StepClock

    if args.num_requests < 1 or args.repeats < 1:
        raise SystemExit(
            f"bench prefill: --num-requests and --repeats must be at least 1, got {args.num_requests}, {args.repeats}"
        )
    config = dataclasses.replace(without_disk_tier(args.engine_config), enable_prefix_caching=False)
    llm = LLM(**dataclasses.asdict(config))
    engine = llm.engine
    clock = StepClock(engine.runner)
    chats = [r.messages for r in chat_requests(args.num_requests)]
    tokens = sum(len(engine.apply_chat_template(c)) for c in chats)
    head = engine.runner.model.lm_head
    layer_weights = clock.linear_weights - head.in_features * head.out_features
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.chat(chats[:2], params)  # warm up
    passes = []
    for _ in range(args.repeats):
        clock.reset()
        start = time.perf_counter()
        llm.chat(chats, params)
        seconds = time.perf_counter() - start
        matmul, attention = clock.read()
        passes.append((seconds, matmul, attention))
    seconds, matmul, attention = min(passes)
    peak = measure_peak(torch.get_num_threads()) if engine.runner.device.type == "cpu" else None
    best = {
        "seconds": seconds,
        "matmul_s": matmul,
        "attention_s": attention,
        "rest_s": seconds - matmul - attention,
        "tokens_per_s": tokens / seconds,
        "layer_linears_gop_per_s": 2 * layer_weights * tokens / matmul / 1e9 if matmul > 0 else 0.0,
    }
    resolved = engine.config
    payload = {
        "model": resolved.model,
        "config": {
            "quantization": resolved.quantization,
            "int8_activations": resolved.int8_activations,
            "dtype": resolved.dtype,
            "kv_cache_dtype": engine.kv_cache_dtype,
            "max_num_batched_tokens": resolved.max_num_batched_tokens,
            "threads": torch.get_num_threads(),
        },
        "workload": {
            "label": "bench serving's chat requests (synthetic), prefilled with max_tokens 1, no prefix caching",
            "num_requests": args.num_requests,
            "prompt_tokens": tokens,
            "repeats": args.repeats,
        },
        "layer_linear_weights": layer_weights,
        "compute_peak": dataclasses.asdict(peak) if peak is not None else None,
        "passes": [dict(zip(("seconds", "matmul_s", "attention_s"), p, strict=True)) for p in passes],
        "best": best,
        "targets": [],
    }
    paths = write_results("prefill", payload, _plot(best), args.results_dir, args.command_line)
    headers = [
        "prompt tokens",
        "seconds",
        "tok/s",
        "matmul s",
        "attention s",
        "rest s",
        "layer linears GOP/s",
    ]
    row = [tokens, seconds, best["tokens_per_s"], matmul, attention, best["rest_s"]]
    print_report(
        f"prefill ({resolved.quantization}, {resolved.dtype})",
        headers,
        [row + [best["layer_linears_gop_per_s"]]],
        (),
        paths,
    )
    if peak is not None:
        print(
            f"the cores' int8 peak on {peak.threads} threads: {peak.int8_gops:.0f} GOP/s (engine/native/peak.c)"
        )
    return payload


def _plot(best: dict[str, float]):
    fig, (ax,) = new_figure(size=(4.0, 4.2))
    bottom = 0.0
    for part in PARTS:
        ax.bar(["prefill"], [best[part]], bottom=[bottom], label=part.removesuffix("_s"))
        bottom += best[part]
    ax.set_ylabel("seconds (best pass)")
    ax.set_title(f"prefill: {best['tokens_per_s']:.0f} tok/s")
    ax.legend(fontsize=8)
    return fig
