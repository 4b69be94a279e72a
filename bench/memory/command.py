"""`bench memory`: KV slots the paged pool allocates vs tokens it stores, against contiguous max-length reservation."""

from __future__ import annotations

import argparse
import dataclasses
import gc
from dataclasses import dataclass
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
from bench.common.workload import LENGTH_MIX_LABEL, filler_token_ids, length_mix

TARGET_WASTE_PCT = 4.0
TARGET_CONCURRENCY_RATIO = 4.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench memory`."""
    parser.add_argument("--num-requests", type=int, default=160)
    parser.add_argument(
        "--budget-seqs",
        type=int,
        default=8,
        help="KV budget, in max_model_len sequences: contiguous reservation admits exactly this many",
    )
    parser.add_argument(
        "--kv-cache-dtypes",
        type=parse_kv_dtypes,
        default="auto,int8",
        help="comma-separated KV cache dtypes, each run on the same mix at the same byte budget (overrides "
        "--kv-cache-dtype); the first is the one the targets judge",
    )


@dataclass(frozen=True)
class StepSample:
    """The pool as one step left it."""

    step: int
    num_running: int
    num_waiting: int
    num_tokens_stored: int
    num_slots_allocated: int
    num_used_blocks: int
    future_tokens: (
        int  # tokens the running requests will still produce (what contiguous reservation holds for them)
    )


def kv_bytes_per_token(hf_config: Any, element_size: int) -> int:
    """K and V bytes of one token across all layers."""
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or int(hf_config.hidden_size) // heads)
    return 2 * int(hf_config.num_hidden_layers) * kv_heads * head_dim * element_size


def summarise(samples: list[StepSample], max_model_len: int, contiguous_capacity: int) -> dict[str, float]:
    """Paged waste and concurrency over the saturated steps (some request still waiting), vs contiguous."""
    busy = [s for s in samples if s.num_waiting > 0] or samples
    slots = sum(s.num_slots_allocated for s in samples)
    stored = sum(s.num_tokens_stored for s in samples)
    contiguous_slots = sum(s.num_running * max_model_len for s in samples)
    future = sum(s.future_tokens for s in samples)
    return {
        "paged_waste_pct": 100.0 * (slots - stored) / slots if slots else float("nan"),
        "contiguous_waste_pct": 100.0 * (contiguous_slots - stored) / contiguous_slots
        if contiguous_slots
        else 0.0,
        "contiguous_reserved_future_pct": 100.0 * future / contiguous_slots if contiguous_slots else 0.0,
        "contiguous_never_used_pct": (
            100.0 * (contiguous_slots - stored - future) / contiguous_slots if contiguous_slots else 0.0
        ),
        "mean_running_saturated": mean([s.num_running for s in busy]),
        "peak_running": max((s.num_running for s in samples), default=0),
        "contiguous_capacity": contiguous_capacity,
        "concurrency_ratio": mean([s.num_running for s in busy]) / max(1, contiguous_capacity),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the traffic mix through the engine once per KV dtype, sampling the pool after every step; print, write
    JSON + PNG (the PNG shows the first dtype's run)."""
    import torch

    from engine.loading.loader import load_hf_config, load_tokenizer, resolve_config_model
    from engine.worker.device import resolve_device, resolve_dtype

    base = args.engine_config
    max_model_len = base.max_model_len or 4096
    path = resolve_config_model(base)
    hf_config = load_hf_config(path)
    dtype = resolve_dtype(base.dtype, resolve_device(base.device))
    per_token = kv_bytes_per_token(hf_config, torch.tensor([], dtype=dtype).element_size())
    budget = (
        args.budget_seqs * max_model_len * per_token
    )  # in the model's dtype: every KV dtype gets these bytes
    mix = length_mix(args.num_requests, args.seed, max_model_len)
    filler = filler_token_ids(
        load_tokenizer(path), max(p for p, _ in mix) + args.num_requests, seed=args.seed
    )
    contiguous_capacity = args.budget_seqs
    results = {}
    for kv_cache_dtype in args.kv_cache_dtypes:
        config = dataclasses.replace(
            base, max_model_len=max_model_len, kv_cache_bytes=budget, kv_cache_dtype=kv_cache_dtype
        )
        results[kv_run_name(kv_cache_dtype)] = _run_mix(config, mix, filler, contiguous_capacity)
    first = next(iter(results.values()))
    summary, samples = first["summary"], first.pop("samples")
    for result in list(results.values())[1:]:
        result.pop("samples")
    targets = [
        Target("paged KV waste %", summary["paged_waste_pct"], TARGET_WASTE_PCT, "<="),
        Target(
            "concurrency vs contiguous reservation", summary["concurrency_ratio"], TARGET_CONCURRENCY_RATIO
        ),
    ]
    payload = {
        "model": base.model,
        "dtype": str(dtype).removeprefix("torch."),
        "workload": {"label": LENGTH_MIX_LABEL, "num_requests": len(mix), "lengths": mix},
        "pool": first["pool"],
        "summary": summary,
        "by_kv_cache_dtype": {
            name: {"pool": r["pool"], "summary": r["summary"]} for name, r in results.items()
        },
        "timeline": [dataclasses.asdict(s) for s in samples],
        "targets": targets_payload(targets),
    }
    fig = _plot(samples, summary, max_model_len, contiguous_capacity)
    paths = write_results("memory", payload, fig, args.results_dir, args.command_line)
    rows = [
        [
            f"paged ({name}, {r['pool']['kv_cache_dtype']})",
            r["pool"]["pool_tokens"],
            r["summary"]["paged_waste_pct"],
            r["summary"]["mean_running_saturated"],
            r["summary"]["peak_running"],
            r["summary"]["num_preemptions"],
        ]
        for name, r in results.items()
    ]
    rows.append(
        [
            f"contiguous max-length ({payload['dtype']})",
            contiguous_capacity * max_model_len,
            summary["contiguous_waste_pct"],
            float(contiguous_capacity),
            contiguous_capacity,
            "",
        ]
    )
    print_report(
        f"memory: {len(mix)} requests, a KV budget of {budget / 2**20:.0f} MiB ({args.budget_seqs} x "
        f"{max_model_len} tokens in {payload['dtype']}), max_model_len {max_model_len}",
        [
            "allocation",
            "pool tokens",
            "KV waste %",
            "mean running (saturated)",
            "peak running",
            "preemptions",
        ],
        rows,
        targets,
        paths,
    )
    return payload


def _run_mix(
    config: Any, mix: list[tuple[int, int]], filler: list[int], contiguous_capacity: int
) -> dict[str, Any]:
    """One engine with `config` through the whole mix: its pool, the step samples and their summary."""
    from engine import LLMEngine, SamplingParams

    engine = LLMEngine(without_disk_tier(config))
    final_len = {}
    for i, (prompt_len, output_len) in enumerate(mix):
        prompt = filler[i : i + prompt_len]  # shifted windows: no two prompts share a first block
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        engine.add_request(f"mem-{i}", prompt, params)
        final_len[f"mem-{i}"] = prompt_len + output_len
    samples: list[StepSample] = []
    per_seq_waste_max = 0
    with progress(len(mix), f"memory mix, {engine.kv_cache_dtype} KV") as bar:
        while engine.has_unfinished_requests():
            outputs = engine.step()
            bar.update(sum(o.finished for o in outputs))
            snap = engine.snapshot()
            stats = snap.stats
            running = [s for s in snap.sequences if s["status"] == "running"]
            for s in running:
                per_seq_waste_max = max(
                    per_seq_waste_max, len(s["block_table"]) * stats.block_size - s["num_computed_tokens"]
                )
            future = sum(final_len[s["request_id"]] - s["num_computed_tokens"] for s in running)
            samples.append(
                StepSample(
                    stats.num_steps,
                    stats.num_running,
                    stats.num_waiting,
                    stats.num_tokens_stored,
                    stats.num_slots_allocated,
                    stats.num_used_blocks,
                    future,
                )
            )
    summary = summarise(samples, config.max_model_len, contiguous_capacity)
    summary["max_waste_per_seq_tokens"] = per_seq_waste_max
    summary["num_preemptions"] = engine.stats().num_preemptions
    pool = {
        "kv_cache_dtype": engine.kv_cache_dtype,
        "num_blocks": engine.num_blocks,
        "block_size": engine.config.block_size,
        "block_bytes": engine.kv_block_bytes,
        "pool_tokens": engine.num_blocks * engine.config.block_size,
        "kv_cache_bytes": config.kv_cache_bytes,
        "max_model_len": config.max_model_len,
        "max_num_seqs": engine.config.max_num_seqs,
    }
    del engine
    gc.collect()
    return {"pool": pool, "samples": samples, "summary": summary}


def _plot(samples: list[StepSample], summary: dict[str, float], max_model_len: int, capacity: int):
    fig, (ax_mem, ax_conc) = new_figure(ncols=2)
    steps = [s.step for s in samples]
    ax_mem.plot(steps, [s.num_tokens_stored for s in samples], label="tokens stored")
    ax_mem.plot(steps, [s.num_slots_allocated for s in samples], "--", label="paged: slots allocated")
    ax_mem.plot(
        steps,
        [s.num_running * max_model_len for s in samples],
        ":",
        label="contiguous: slots reserved for the same sequences",
    )
    ax_mem.set_xlabel("engine step")
    ax_mem.set_ylabel("KV slots (tokens)")
    ax_mem.set_yscale("log")
    ax_mem.set_title(
        f"paged waste {summary['paged_waste_pct']:.1f}% vs contiguous {summary['contiguous_waste_pct']:.0f}%"
    )
    ax_mem.legend(fontsize=8)
    ax_conc.plot(steps, [s.num_running for s in samples], label="pagedchat running sequences")
    ax_conc.axhline(
        capacity, color="tab:red", linestyle="--", label=f"contiguous reservation admits {capacity}"
    )
    ax_conc.set_xlabel("engine step")
    ax_conc.set_ylabel("concurrent sequences")
    ax_conc.set_title(f"{summary['concurrency_ratio']:.1f}x the concurrency at the same KV budget")
    ax_conc.legend(fontsize=8)
    return fig
