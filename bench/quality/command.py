"""`bench quality`: what quantization does to the model's outputs, against the float reference (quantization none,
fp32): greedy agreement, |Δ logprob| of the reference's own tokens (teacher-forced), perplexity on a fixed text.
Each int8- or fp16-KV-cache mode is also compared with the same mode on a KV cache of the model's dtype (its twin)."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common.report import (
    Target,
    mean,
    new_figure,
    print_report,
    progress,
    targets_payload,
    without_disk_tier,
    write_results,
)

logger = logging.getLogger(__name__)

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a short Python function that reverses a string.",
    "Tell me a fun fact about octopuses.",
    "What are the three states of matter?",
    "Suggest a name for a small bakery.",
    "How many days are there in a leap year?",
    "Describe a sunset in one sentence.",
    "What does a compiler do?",
    "Give two tips for sleeping better.",
    "Who wrote Romeo and Juliet?",
    "Summarise the water cycle briefly.",
]
TEXT_FILE = Path(__file__).parents[1] / "data" / "pride_and_prejudice_ch1.txt"  # public domain (Austen, 1813)
REFERENCE = "none-fp32"
# mode name -> EngineConfig overrides; the reference first, every other mode is compared with it
_FLOAT_KV = {"kv_cache_dtype": "auto"}
_INT8_KV = {"kv_cache_dtype": "int8"}
_FP16_KV = {"kv_cache_dtype": "float16"}
MODES: dict[str, dict[str, Any]] = {
    REFERENCE: {"quantization": "none", "dtype": "float32", "int8_activations": False, **_FLOAT_KV},
    # the gguf modes multiply batches in fp32 (exact), but gguf-bf16gemm and gguf-int8gemm: batch_gemm's bf16 copy
    # or int8 GEMM, each on its own
    "gguf": {"quantization": "gguf", "int8_activations": False, "batch_gemm": "fp32", **_FLOAT_KV},
    "gguf-bf16gemm": {"quantization": "gguf", "int8_activations": False, "batch_gemm": "bf16", **_FLOAT_KV},
    "gguf-int8gemm": {"quantization": "gguf", "int8_activations": False, "batch_gemm": "int8", **_FLOAT_KV},
    "gguf-int8act": {"quantization": "gguf", "int8_activations": True, "batch_gemm": "fp32", **_FLOAT_KV},
    # int8 activations in decode and in batches: the default with gguf on a CPU without fast bf16 (AVX2), as llama.cpp
    "gguf-int8": {"quantization": "gguf", "int8_activations": True, "batch_gemm": "int8", **_FLOAT_KV},
    "none-fp32-int8kv": {"quantization": "none", "dtype": "float32", "int8_activations": False, **_INT8_KV},
    "gguf-int8kv": {"quantization": "gguf", "int8_activations": False, "batch_gemm": "fp32", **_INT8_KV},
    "gguf-int8-int8kv": {"quantization": "gguf", "int8_activations": True, "batch_gemm": "int8", **_INT8_KV},
    "none-fp32-fp16kv": {"quantization": "none", "dtype": "float32", "int8_activations": False, **_FP16_KV},
    "gguf-fp16kv": {"quantization": "gguf", "int8_activations": False, "batch_gemm": "fp32", **_FP16_KV},
    "gguf-int8-fp16kv": {"quantization": "gguf", "int8_activations": True, "batch_gemm": "int8", **_FP16_KV},
    "none-bf16": {"quantization": "none", "dtype": "bfloat16", "int8_activations": False, **_FLOAT_KV},
    "none-bf16-int8kv": {"quantization": "none", "dtype": "bfloat16", "int8_activations": False, **_INT8_KV},
}
# an int8- or fp16-KV mode -> the same mode with a KV cache of the model's dtype: the rounded cache's own effect is
# measured against it
KV_TWINS = {
    "none-fp32-int8kv": REFERENCE,
    "gguf-int8kv": "gguf",
    "gguf-int8-int8kv": "gguf-int8",
    "none-bf16-int8kv": "none-bf16",
    "none-fp32-fp16kv": REFERENCE,
    "gguf-fp16kv": "gguf",
    "gguf-int8-fp16kv": "gguf-int8",
}
TARGET_GGUF_MEAN_ABS_DLOGPROB = 0.01  # the exact kernel differs from fp32 only in summation order
DEFAULT_KV_CACHE_BYTES = 256 * 2**20  # SmolLM2 in fp32: ~5.7k tokens; 16 prompts + 64 tokens need ~2k
DEFAULT_MAX_MODEL_LEN = 1024
HEADERS = [
    "mode", "quant", "dtype", "prefix agree %", "overall agree %", "identical", "mean |Δlp|", "max |Δlp|", "PPL",
    "decode tok/s",
]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench quality`."""
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS), help=f"at most {len(PROMPTS)}")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} ({REFERENCE} always runs; an int8- or fp16-KV "
        "mode brings its twin on a KV cache of the model's dtype)",
    )


@dataclass
class ModeRun:
    """What one mode produced: greedy tokens, the reference tokens' logprobs, the text's per-token logprobs."""

    greedy: list[list[int]]
    ref_logprobs: list[list[float]]
    text_logprobs: list[float]
    config: dict[str, Any]
    load_s: float
    decode_tokens_per_s: float


def agreement(reference: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    """Greedy agreement: mean share of positions before the first divergence, share of equal positions overall,
    and outputs identical in full."""
    prefix, equal, total, identical = [], 0, 0, 0
    for ref, out in zip(reference, got, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
        prefix.append(first / max(1, len(ref)))
        equal += sum(a == b for a, b in zip(ref, out))
        total += max(len(ref), len(out))
        identical += ref == out
    return {
        "prefix_agreement": mean(prefix),
        "overall_agreement": equal / total if total else float("nan"),
        "identical_outputs": identical,
    }


def logprob_delta(reference: list[list[float]], got: list[list[float]]) -> dict[str, float]:
    """Mean and max |Δ logprob| of the reference's greedy tokens, teacher-forced."""
    deltas = [
        abs(a - b) for ref, out in zip(reference, got, strict=True) for a, b in zip(ref, out, strict=True)
    ]
    return {"mean_abs_dlogprob": mean(deltas), "max_abs_dlogprob": max(deltas, default=float("nan"))}


def perplexity(logprobs: list[float]) -> float:
    """exp of the mean negative log-likelihood."""
    return math.exp(-mean(logprobs)) if logprobs else float("nan")


def _run_mode(
    config: Any,
    prompts: list[list[int]],
    ref_greedy: list[list[int]] | None,
    text_ids: list[int],
    max_tokens: int,
) -> ModeRun:
    """Build the engine for one mode, decode greedily, and score the reference's tokens and the text."""
    from engine import LLM, SamplingParams
    from engine.worker.scoring import score_tokens

    start = time.perf_counter()
    llm = LLM(**dataclasses.asdict(without_disk_tier(config)))
    load_s = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    greedy = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    decode_tps = sum(map(len, greedy)) / (time.perf_counter() - start)
    forced = greedy if ref_greedy is None else ref_greedy
    runner = llm.engine.runner
    scored = score_tokens(runner, [p + r for p, r in zip(prompts, forced)], [len(p) for p in prompts])
    text = score_tokens(runner, [text_ids], [1])[0]
    resolved = llm.engine.config
    settings = {
        "quantization": resolved.quantization,
        "dtype": resolved.dtype,
        "int8_activations": resolved.int8_activations,
        "kv_cache_dtype": llm.engine.kv_cache_dtype,
    }
    del llm
    gc.collect()
    return ModeRun(greedy, [s.tolist() for s in scored], text.tolist(), settings, load_s, decode_tps)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every mode on the fixed prompts and text; print the table, write JSON + PNG."""
    from engine.loading.loader import load_hf_config, load_tokenizer, resolve_config_model

    base = args.engine_config
    path = resolve_config_model(base)
    model_limit = int(load_hf_config(path).max_position_embeddings)
    if base.kv_cache_bytes is None:
        base = dataclasses.replace(base, kv_cache_bytes=DEFAULT_KV_CACHE_BYTES)
    if base.max_model_len is None:  # a pool that holds one max-length sequence, not the model's 4096 tokens
        base = dataclasses.replace(base, max_model_len=min(DEFAULT_MAX_MODEL_LEN, model_limit))
    num_prompts = max(1, min(args.num_prompts, len(PROMPTS)))
    tokenizer = load_tokenizer(path)  # one tokenization, fed as ids to every mode
    max_len = min(base.max_model_len, model_limit)
    prompts = [
        list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False))
        for p in PROMPTS[:num_prompts]
    ]  # fmt: skip
    text_ids = list(tokenizer(TEXT_FILE.read_text(), add_special_tokens=False).input_ids)[:max_len]
    selected = _selected_modes(args.modes)
    runs: dict[str, ModeRun] = {}
    skipped: dict[str, str] = {}
    with progress(len(selected), "quality modes", unit="mode") as bar:
        for name in selected:
            overrides = MODES[name]
            try:
                ref = runs[REFERENCE].greedy if name != REFERENCE else None
                config = dataclasses.replace(base, **overrides)
                runs[name] = _run_mode(config, prompts, ref, text_ids, args.max_tokens)
            except ValueError as exc:  # e.g. quantization gguf on CUDA or for a float checkpoint
                if name == REFERENCE:
                    raise
                logger.warning("mode %s skipped: %s", name, exc)
                skipped[name] = str(exc)
            bar.update(1)
    reference = runs[REFERENCE]
    modes: dict[str, dict[str, Any]] = {}
    for name, got in runs.items():
        modes[name] = {
            **got.config,
            **agreement(reference.greedy, got.greedy),
            **logprob_delta(reference.ref_logprobs, got.ref_logprobs),
            "perplexity": perplexity(got.text_logprobs),
            "load_s": got.load_s,
            "decode_tokens_per_s": got.decode_tokens_per_s,
        }
    kv_rounded = {  # each int8- or fp16-KV mode against its twin: the cache's own effect
        name: {
            "against": twin,
            **agreement(runs[twin].greedy, runs[name].greedy),
            **logprob_delta(runs[twin].ref_logprobs, runs[name].ref_logprobs),
            "perplexity_delta": modes[name]["perplexity"] - modes[twin]["perplexity"],
        }
        for name, twin in KV_TWINS.items()
        if name in runs and twin in runs
    }
    targets = []
    if "gguf" in modes:
        targets.append(
            Target(
                "gguf: mean |Δ logprob| vs fp32",
                modes["gguf"]["mean_abs_dlogprob"],
                TARGET_GGUF_MEAN_ABS_DLOGPROB,
                "<=",
            )
        )
    payload = {
        "model": base.model,
        "reference": REFERENCE,
        "workload": {
            "prompts": PROMPTS[:num_prompts],
            "max_tokens": args.max_tokens,
            "text_file": TEXT_FILE.name,
            "text_tokens": len(text_ids),
        },
        "modes": modes,
        "rounded_kv_vs_model_dtype_kv": kv_rounded,
        "skipped": skipped,
        "greedy_tokens": {name: r.greedy for name, r in runs.items()},
        "targets": targets_payload(targets),
    }
    paths = write_results("quality", payload, _plot(runs), args.results_dir, args.command_line)
    rows = [
        [
            name,
            m["quantization"],
            m["dtype"],
            100 * m["prefix_agreement"],
            100 * m["overall_agreement"],
            f"{m['identical_outputs']}/{num_prompts}",
            m["mean_abs_dlogprob"],
            m["max_abs_dlogprob"],
            m["perplexity"],
            m["decode_tokens_per_s"],
        ]
        for name, m in modes.items()
    ]
    print_report(
        f"quality: {num_prompts} chat prompts x {args.max_tokens} greedy tokens, perplexity on {len(text_ids)} tokens "
        f"of {TEXT_FILE.name}; reference {REFERENCE}",
        HEADERS,
        rows,
        targets,
        paths,
    )
    for name, m in kv_rounded.items():
        print(
            f"{name} vs {m['against']} (the {MODES[name]['kv_cache_dtype']} KV cache alone): {m['identical_outputs']}/{num_prompts} identical, "
            f"prefix agreement {100 * m['prefix_agreement']:.1f}%, mean |Δlp| {m['mean_abs_dlogprob']:.4f}, "
            f"max |Δlp| {m['max_abs_dlogprob']:.4f}, ΔPPL {m['perplexity_delta']:+.3f}"
        )
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    return payload


def _selected_modes(spec: str) -> list[str]:
    """The modes to run, in MODES order: the reference, those named, and the twin of each int8- or fp16-KV one."""
    names = {n.strip() for n in spec.split(",") if n.strip()}
    unknown = names - MODES.keys()
    if unknown:
        raise SystemExit(f"unknown quality modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    names |= {REFERENCE} | {KV_TWINS[n] for n in names if n in KV_TWINS}
    return [n for n in MODES if n in names]


def _plot(runs: dict[str, ModeRun]):
    fig, (ax_delta, ax_ppl) = new_figure(ncols=2)
    reference = runs[REFERENCE]
    for name, got in runs.items():
        if name == REFERENCE:
            continue
        length = min(map(len, reference.ref_logprobs))
        per_position = [
            mean([abs(r[i] - g[i]) for r, g in zip(reference.ref_logprobs, got.ref_logprobs)])
            for i in range(length)
        ]
        ax_delta.plot(range(length), per_position, label=name)
    ax_delta.set_xlabel("greedy position")
    ax_delta.set_ylabel(f"mean |Δ logprob| vs {REFERENCE}")
    ax_delta.set_yscale("symlog", linthresh=1e-7)  # the exact mode can be 0 at some positions
    ax_delta.legend(fontsize=8)
    names = list(runs)
    ax_ppl.bar(names, [perplexity(runs[n].text_logprobs) for n in names])
    ax_ppl.set_ylabel("perplexity on the fixed text")
    return fig
