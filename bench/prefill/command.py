"""`bench prefill`: how fast the engine prefills `bench serving`'s prompts, split into the linears, attention and the
rest, beside the cores' int8 peak.

The prompts are `bench serving`'s chat requests (bench/common/workload.py, the same seed; its 64-stream point sends
128), prefilled offline with max_tokens 1 and prefix caching off, so every repeat computes every token, in steps of
max_num_batched_tokens. The step clock (engine/worker/step_clock.py, as `bench step` uses it) times every linear and
the attention backend. The layer linears' rate counts 2 operations a weight and prompt token over the matmul time,
which also holds the LM head of each prompt's last token; the peak is engine/native/peak.c's on the same threads.

`--prompt-tokens N` prefills one prompt of N tokens instead (a pasted document: seeded meeting notes, as token ids),
and `--baseline-url` sends that very prompt (the same ids) to llama.cpp's `llama-server` (its `/completion`, one
token predicted, its prompt cache off) `--repeats` times and reports its prompt tokens/s from its own timings beside
ours, as a ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from bench.common.report import new_figure, print_report, without_disk_tier, write_results
from bench.common.workload import chat_requests, filler_token_ids

PARTS = ("matmul_s", "attention_s", "rest_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench prefill`."""
    parser.add_argument(
        "--num-requests", type=int, default=128, help="prompts (default 128: what bench serving's c=64 sends)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes over the prompts; the best is kept"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="prefill one prompt of this many tokens (a long document) instead of bench serving's prompts; "
        "it needs --max-model-len above it",
    )
    parser.add_argument(
        "--baseline-url",
        default=None,
        help="with --prompt-tokens: a running llama.cpp llama-server on the same GGUF; the same prompt's ids go to "
        "its /completion (1 token, cache_prompt false) and its prompt tok/s is reported beside ours",
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
    if args.baseline_url and args.prompt_tokens < 1:
        raise SystemExit("bench prefill: --baseline-url needs --prompt-tokens (one long prompt sent to both)")
    config = dataclasses.replace(without_disk_tier(args.engine_config), enable_prefix_caching=False)
    llm = LLM(**dataclasses.asdict(config))
    engine = llm.engine
    clock = StepClock(engine.runner)
    prompts: list[list[int]]
    if args.prompt_tokens > 0:
        prompts = [filler_token_ids(engine.tokenizer, args.prompt_tokens, seed=args.seed)]
        tokens = args.prompt_tokens
        label = f"one prompt of {tokens} tokens (seeded meeting notes), max_tokens 1, no prefix caching"
    else:
        prompts = [engine.apply_chat_template(r.messages) for r in chat_requests(args.num_requests)]
        tokens = sum(len(p) for p in prompts)
        label = "bench serving's chat requests (synthetic), prefilled with max_tokens 1, no prefix caching"
    head = engine.runner.model.lm_head
    layer_weights = clock.linear_weights - head.in_features * head.out_features
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate(prompts[:2], params)  # warm up
    passes = []
    for _ in range(args.repeats):
        clock.reset()
        start = time.perf_counter()
        llm.generate(prompts, params)
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
            "label": label,
            "num_requests": len(prompts),
            "prompt_tokens": tokens,
            "repeats": args.repeats,
        },
        "layer_linear_weights": layer_weights,
        "compute_peak": dataclasses.asdict(peak) if peak is not None else None,
        "passes": [dict(zip(("seconds", "matmul_s", "attention_s"), p, strict=True)) for p in passes],
        "best": best,
        "targets": [],
    }
    if args.baseline_url:
        baseline = _baseline(args.baseline_url, prompts[0], args.repeats)
        payload["baseline"] = baseline
        payload["ratio_tokens_per_s"] = best["tokens_per_s"] / baseline["tokens_per_s"]
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
    if args.baseline_url:
        b = payload["baseline"]
        print(
            f"{b['name']} on the same {tokens}-token prompt: {b['tokens_per_s']:.0f} tok/s (best of "
            f"{len(b['passes_ms'])}; its own timings) -> pagedchat / {b['name']}: {payload['ratio_tokens_per_s']:.2f}x"
        )
    if peak is not None:
        print(
            f"the cores' int8 peak on {peak.threads} threads: {peak.int8_gops:.0f} GOP/s (engine/native/peak.c)"
        )
    return payload


def _baseline(url: str, ids: list[int], repeats: int) -> dict[str, Any]:
    """The prompt's prefill on a llama-server: its /completion with one token predicted and its prompt cache off,
    `repeats` times after a warm-up; its prompt time from its own `timings`."""
    import httpx

    from bench.common import servers

    name = servers.baseline_name(servers.served_model(url))
    body = {"prompt": ids, "n_predict": 1, "cache_prompt": False, "temperature": 0.0}
    passes = []
    with httpx.Client(base_url=url, timeout=3600) as client:
        for i in range(repeats + 1):
            response = client.post("/completion", json=body)
            response.raise_for_status()
            timings = response.json()["timings"]
            if timings["prompt_n"] != len(ids):
                raise RuntimeError(f"{name} read {timings['prompt_n']} prompt tokens, not {len(ids)}")
            if i:  # the first is a warm-up
                passes.append(timings["prompt_ms"])
    return {"name": name, "url": url, "passes_ms": passes, "tokens_per_s": 1000 * len(ids) / min(passes)}


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
