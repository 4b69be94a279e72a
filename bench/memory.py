"""`bench memory`: KV slots the paged pool allocates vs tokens it stores, against contiguous max-length reservation."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from bench.common import (
    Target,
    mean,
    new_figure,
    print_report,
    progress,
    targets_payload,
    write_results,
)
from bench.workload import LENGTH_MIX_LABEL, filler_token_ids, length_mix

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
    """Run the traffic mix through the engine, sampling the pool after every step; print, write JSON + PNG."""
    import torch

    from engine import LLMEngine, SamplingParams
    from engine.loading.loader import load_hf_config, load_tokenizer, resolve_model_path
    from engine.worker.device import resolve_device, resolve_dtype

    base = args.engine_config
    max_model_len = base.max_model_len or 4096
    path = resolve_model_path(base.model)
    hf_config = load_hf_config(path)
    dtype = resolve_dtype(base.dtype, resolve_device(base.device))
    per_token = kv_bytes_per_token(hf_config, torch.tensor([], dtype=dtype).element_size())
    config = dataclasses.replace(
        base,
        max_model_len=max_model_len,
        kv_cache_bytes=args.budget_seqs * max_model_len * per_token,
    )
    engine = LLMEngine(config)
    pool_tokens = engine.num_blocks * engine.config.block_size
    contiguous_capacity = pool_tokens // max_model_len
    mix = length_mix(args.num_requests, args.seed, max_model_len)
    filler = filler_token_ids(
        load_tokenizer(path), max(p for p, _ in mix) + args.num_requests, seed=args.seed
    )
    final_len = {}
    for i, (prompt_len, output_len) in enumerate(mix):
        prompt = filler[i : i + prompt_len]  # shifted windows: no two prompts share a first block
        params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
        engine.add_request(f"mem-{i}", prompt, params)
        final_len[f"mem-{i}"] = prompt_len + output_len
    samples: list[StepSample] = []
    per_seq_waste_max = 0
    with progress(len(mix), "memory mix") as bar:
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
    summary = summarise(samples, max_model_len, contiguous_capacity)
    summary["max_waste_per_seq_tokens"] = per_seq_waste_max
    summary["num_preemptions"] = engine.stats().num_preemptions
    targets = [
        Target("paged KV waste %", summary["paged_waste_pct"], TARGET_WASTE_PCT, "<="),
        Target(
            "concurrency vs contiguous reservation", summary["concurrency_ratio"], TARGET_CONCURRENCY_RATIO
        ),
    ]
    payload = {
        "model": base.model,
        "dtype": engine.config.dtype,
        "workload": {"label": LENGTH_MIX_LABEL, "num_requests": len(mix), "lengths": mix},
        "pool": {
            "num_blocks": engine.num_blocks,
            "block_size": engine.config.block_size,
            "pool_tokens": pool_tokens,
            "kv_cache_bytes": config.kv_cache_bytes,
            "max_model_len": max_model_len,
            "max_num_seqs": engine.config.max_num_seqs,
        },
        "summary": summary,
        "timeline": [dataclasses.asdict(s) for s in samples],
        "targets": targets_payload(targets),
    }
    fig = _plot(samples, summary, max_model_len, contiguous_capacity)
    paths = write_results("memory", payload, fig, args.results_dir, args.command_line)
    rows = [
        [
            "paged (pagedchat)",
            summary["paged_waste_pct"],
            summary["mean_running_saturated"],
            summary["peak_running"],
        ],
        [
            "contiguous max-length",
            summary["contiguous_waste_pct"],
            float(contiguous_capacity),
            contiguous_capacity,
        ],
    ]
    print_report(
        f"memory: {len(mix)} requests, KV pool of {pool_tokens} tokens, max_model_len {max_model_len}",
        ["allocation", "KV waste %", "mean running (saturated)", "peak running"],
        rows,
        targets,
        paths,
    )
    return payload


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
