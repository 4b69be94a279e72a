"""`bench throughput`: the same chat requests through pagedchat and HF transformers baselines, in one run."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import time
from pathlib import Path
from typing import Any

from bench.common.report import (
    Target,
    kv_run_name,
    mean,
    new_figure,
    parse_kv_dtypes,
    print_report,
    progress,
    targets_payload,
    without_disk_tier,
    write_results,
)
from bench.common.workload import WORKLOAD_LABEL, chat_requests
from engine.core.structured import StructuredOutput

logger = logging.getLogger(__name__)
TARGET_VS_STATIC = 2.0
BASELINES = ("static", "continuous", "sequential")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench throughput`."""
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="the largest per-request max_tokens of the mix"
    )
    parser.add_argument(
        "--baselines",
        type=parse_baselines,
        default="static,continuous,sequential",
        help="comma-separated HF baselines to run: static, continuous, sequential, or none",
    )
    parser.add_argument(
        "--kv-cache-dtypes",
        type=parse_kv_dtypes,
        default="auto",
        help="comma-separated KV cache dtypes pagedchat runs with, one after the other (auto,int8: the int8 cache "
        "beside the float one); overrides --kv-cache-dtype",
    )
    parser.add_argument(
        "--json-schema",
        type=read_json_schema,
        default=None,
        metavar="FILE",
        help="also run the same requests with their output constrained to this JSON schema (response_format "
        "json_schema) and report tokens/s with and without it",
    )
    parser.add_argument("--matmul-rows", type=int, default=64, help="rows of the matmul ceiling measurement")
    parser.add_argument("--matmul-seconds", type=float, default=2.0)
    parser.add_argument("--hf-page-size", type=int, default=32, help="page size of HF continuous batching")
    parser.add_argument(
        "--hf-max-batch-tokens", type=int, default=512, help="HF continuous batching token budget"
    )


def parse_baselines(text: str) -> list[str]:
    """The baseline names of a comma-separated list ('none' or '' for none); unknown names are an argparse error."""
    names = [n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown baselines {unknown}; choose from {list(BASELINES)}")
    return names


def read_json_schema(path: str) -> StructuredOutput:
    """The JSON schema in file `path` as a constraint; an argparse error says what is wrong with it."""
    try:
        return StructuredOutput.json_schema(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:  # not JSON, not an object, or not a schema the grammar engine compiles
        raise argparse.ArgumentTypeError(f"{path}: {exc}") from None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark, print the table and targets, write JSON + PNG; returns the JSON payload."""
    # transformers (the HF baselines) loads when the benchmark runs, not when `pagedchat bench` builds its parser
    import torch

    from bench.throughput import hf_baselines as hf
    from bench.throughput.matmul import linear_shapes, measure_matmul
    from engine import LLM, SamplingParams
    from engine.loading.loader import load_hf_config, resolve_config_model

    baselines = args.baselines
    path = resolve_config_model(args.engine_config)
    requests = chat_requests(args.num_requests, seed=args.seed, max_tokens=args.max_tokens)
    max_tokens = [r.max_tokens for r in requests]
    runs = []
    structured: dict[str, Any] | None = None
    engine_configs = {}
    for kv_cache_dtype in args.kv_cache_dtypes:
        config = dataclasses.replace(args.engine_config, kv_cache_dtype=kv_cache_dtype)
        llm = LLM(**dataclasses.asdict(without_disk_tier(config)))
        engine = llm.engine
        dtype = getattr(torch, engine.config.dtype)
        device = torch.device(engine.config.device)
        prompts = [engine.apply_chat_template(r.messages) for r in requests]
        eos_ids = engine.eos_token_ids
        pad_id = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else min(eos_ids)
        # warm-up, not timed, on a prompt outside the workload so that no measured prompt is cached by it
        warmup = engine.apply_chat_template([{"role": "user", "content": "Warm-up: say hi."}])
        llm.generate([warmup], SamplingParams(temperature=0.0, max_tokens=4))
        name = kv_run_name(kv_cache_dtype)
        with progress(len(prompts), name) as bar:
            params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
            start = time.perf_counter()
            outputs = _generate_with_progress(llm, prompts, params, bar)
            elapsed = time.perf_counter() - start
        runs.append(hf.GenerationRun(name, [list(o.outputs[0].token_ids) for o in outputs], elapsed))
        if args.json_schema is not None and structured is None:  # once, beside the first KV dtype's run
            structured = _structured_run(llm, prompts, max_tokens, args.json_schema, runs[-1])
        engine_stats = engine.stats()
        engine_configs[name] = {
            **dataclasses.asdict(engine.config),
            "num_blocks": engine.num_blocks,
            "kv_cache_tokens": engine_stats.capacity_tokens,
            "kv_cache_stores": engine_stats.kv_cache_dtype,
            "num_steps": engine_stats.num_steps,
            "num_preemptions": engine_stats.num_preemptions,
        }
        del llm, engine, outputs  # free the KV pool before the next run allocates its own
        gc.collect()

    if baselines:
        model = hf.load_hf_model(path, dtype, device)
        hf.hf_sequential(model, [warmup], [4], eos_ids, pad_id)  # warm-up, not timed
        for name in baselines:
            runs.append(_run_baseline(name, model, prompts, max_tokens, eos_ids, pad_id, args))

    with progress(None, "matmul ceiling", unit="pass") as bar:
        matmul = measure_matmul(
            linear_shapes(load_hf_config(path)),
            dtype,
            device,
            rows=args.matmul_rows,
            min_seconds=args.matmul_seconds,
        )
        bar.update(1)
    ours = runs[0]
    num_ours = len(args.kv_cache_dtypes)
    systems = {
        r.name: {
            "tokens_per_s": r.tokens_per_s,
            "num_output_tokens": r.num_output_tokens,
            "elapsed_s": r.elapsed_s,
        }
        for r in runs
    }
    ratios = {f"{ours.name}/{r.name}": ours.tokens_per_s / r.tokens_per_s for r in runs[1:]}
    agreement = {r.name: hf.agreement(ours.token_ids, r.token_ids) for r in runs[1:]}
    for other in runs[1:num_ours]:  # each other KV dtype against the first one's run, and the first baseline
        ratios[f"{other.name}/{ours.name}"] = other.tokens_per_s / ours.tokens_per_s
    fraction = ours.tokens_per_s / matmul.ceiling_tokens_per_s
    targets = []
    if "hf_static" in systems:
        targets.append(
            Target("pagedchat / HF static batching", ratios[f"{ours.name}/hf_static"], TARGET_VS_STATIC)
        )
    payload = {
        "model": args.model,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "workload": {
            "label": WORKLOAD_LABEL,
            "num_requests": len(prompts),
            "max_tokens": max_tokens,
            "mean_prompt_tokens": mean([len(p) for p in prompts]),
            "max_prompt_tokens": max(len(p) for p in prompts),
            "ignore_eos": False,
            "eos_token_ids": sorted(eos_ids),
        },
        "engine_config": engine_configs[ours.name],
        "engine_configs": engine_configs,
        "systems": systems,
        "ratios": ratios,
        "agreement_with_pagedchat": agreement,
        "matmul": {**matmul.as_dict(), "engine_fraction": fraction},
        "targets": targets_payload(targets),
        "structured_output": structured,
    }
    fig = _plot(runs, matmul.ceiling_tokens_per_s, args)
    paths = write_results("throughput", payload, fig, args.results_dir, args.command_line)
    rows = [
        [r.name, r.num_output_tokens, r.elapsed_s, r.tokens_per_s, ours.tokens_per_s / r.tokens_per_s]
        for r in runs
    ]
    if structured is not None:
        rows.append(
            [
                structured["name"],
                structured["num_output_tokens"],
                structured["elapsed_s"],
                structured["tokens_per_s"],
                ours.tokens_per_s / structured["tokens_per_s"],
            ]
        )
    rows.append(["matmul ceiling", "", "", matmul.ceiling_tokens_per_s, fraction])
    print_report(
        f"throughput: {len(prompts)} chat requests, {payload['dtype']} on {device}",
        ["system", "output tokens", "seconds", "tokens/s", "pagedchat ratio"],
        rows,
        targets,
        paths,
    )
    print(
        f"matmul at {matmul.rows} rows: {matmul.flops_per_s / 1e9:.0f} GFLOP/s -> pagedchat reaches "
        f"{100 * fraction:.1f}% of the ceiling"
    )
    if structured is not None:
        print(
            f"structured output: {structured['tokens_per_s']:.1f} tokens/s with the JSON schema vs "
            f"{structured['unconstrained_tokens_per_s']:.1f} without ({structured['cost_pct']:+.1f}% time per "
            f"token); {structured['num_stopped']} of {len(prompts)} stopped (all parse: "
            f"{structured['num_parsed']} parsed), the rest hit max_tokens"
        )
    return payload


def _structured_run(llm, prompts, max_tokens, constraint: StructuredOutput, free) -> dict[str, Any]:
    """The same requests, greedy, constrained to the JSON schema: tokens/s against the unconstrained run `free`."""
    from engine import SamplingParams
    from engine.core.sequence import FinishReason

    llm.engine.check_structured(constraint)  # the grammar tokenizer is built once per engine: not timed
    name = f"{free.name} + json schema"
    with progress(len(prompts), name) as bar:
        params = [SamplingParams(temperature=0.0, max_tokens=m, structured=constraint) for m in max_tokens]
        start = time.perf_counter()
        # the unconstrained pass cached these prompts: a salt of its own makes this pass prefill them as that one did
        outputs = _generate_with_progress(llm, prompts, params, bar, cache_salt="json-schema-pass")
        elapsed = time.perf_counter() - start
    samples = [o.outputs[0] for o in outputs]
    stopped = [s for s in samples if s.finish_reason is FinishReason.STOP]
    num_parsed = 0
    for s in stopped:
        try:
            json.loads(s.text)
            num_parsed += 1
        except ValueError:
            logger.error("a constrained output that stopped does not parse: %r", s.text[:200])
    num_tokens = sum(len(s.token_ids) for s in samples)
    tokens_per_s = num_tokens / elapsed
    return {
        "name": name,
        "schema": json.loads(constraint.spec),
        "num_output_tokens": num_tokens,
        "elapsed_s": elapsed,
        "tokens_per_s": tokens_per_s,
        "unconstrained_tokens_per_s": free.tokens_per_s,
        "cost_pct": 100.0 * (free.tokens_per_s / tokens_per_s - 1.0),
        "num_stopped": len(stopped),
        "num_parsed": num_parsed,
    }


def _generate_with_progress(llm, prompts, params, bar, cache_salt: str | None = None) -> list:
    """`llm.generate`, but stepping the engine here so the bar moves as requests finish. A `cache_salt` of its own
    keeps a second pass over the same prompts from hitting the first pass's cached blocks."""
    engine = llm.engine
    ids = [f"tp-{i}" for i in range(len(prompts))]
    for rid, prompt, p in zip(ids, prompts, params, strict=True):
        engine.add_request(rid, prompt, p, cache_salt=cache_salt)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
                bar.update(1)
    return [done[rid] for rid in ids]


def _run_baseline(name, model, prompts, max_tokens, eos_ids, pad_id, args):
    from bench.throughput import hf_baselines as hf

    with progress(len(prompts), f"HF {name}") as bar:
        if name == "sequential":
            return hf.hf_sequential(
                model, prompts, max_tokens, eos_ids, pad_id, on_done=lambda: bar.update(1)
            )
        if name == "static":
            result = hf.hf_static_batch(model, prompts, max_tokens, eos_ids, pad_id)
            bar.update(len(prompts))
            return result
        return hf.hf_continuous(
            model,
            prompts,
            max_tokens,
            eos_ids,
            pad_id,
            page_size=args.hf_page_size,
            max_batch_tokens=args.hf_max_batch_tokens,
            on_done=lambda: bar.update(1),
        )


def _plot(runs, ceiling: float, args):
    fig, (ax,) = new_figure()
    names = [r.name for r in runs]
    values = [r.tokens_per_s for r in runs]
    bars = ax.bar(names, values, color=["tab:blue"] + ["tab:gray"] * (len(runs) - 1))
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:.0f}", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
    ax.axhline(ceiling, color="tab:red", linestyle="--", label=f"matmul ceiling ({ceiling:.0f} tok/s)")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{len(runs[0].token_ids)} chat requests, max_tokens <= {args.max_tokens}")
    ax.legend()
    return fig
