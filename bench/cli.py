"""`pagedchat bench {throughput,memory,serving,multiturn,quality,step,prefill,attention,speculative,models,make-gguf}`:
parsing and dispatch."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import shlex
import sys

from engine.cli import add_engine_args, config_from_args, fetch_model

BENCHMARKS = {
    "throughput": "offline tokens/s: pagedchat vs HF transformers (sequential, static batch, continuous batching)",
    "memory": "paged KV waste and concurrency vs contiguous max-length reservation",
    "serving": "OpenAI-API load test (Poisson rates, then closed-loop concurrency): pagedchat vs an HF one-at-a-time "
    "server or any OpenAI-compatible one (--baseline-url, e.g. llama.cpp)",
    "multiturn": "N users x K turns with a shared system prompt: session API and /v1, prefix caching on and off; "
    "--scenario returning: users who come back after eviction, with the KV disk tier, without it, and a restart; "
    "--replicas N: replica sets on Ray Serve per --routing policy, --compare-plain (Ray's overhead), "
    "--kill-replica-at TURN (a failover)",
    "quality": "quantization vs the fp32 model: greedy agreement, |Δ logprob| (teacher-forced), perplexity",
    "step": "a decode step's time split into matmuls, attention and the rest, at a few batch sizes",
    "prefill": "bench serving's prompts prefilled offline: tokens/s split into matmuls, attention and the rest",
    "attention": "the CPU decode-attention kernel's KV bandwidth per KV dtype, against the machine's streaming read",
    "speculative": "prompt-lookup (n-gram) speculation on a chat workload (edits, quotes, revisions, open questions): "
    "decode tok/s of each greedy request alone with speculation and without, acceptance, greedy agreement; "
    "--concurrency N: total tok/s N at a time; --baseline-url: llama.cpp's llama-server on the same prompts",
    "models": "several models in one server: a stream on the default model while another loads, then requests "
    "alternating between two more, with a budget that holds them and one that reloads; --baseline-*-url: "
    "llama.cpp's router mode on the same files",
}
# helpers that make inputs for the benchmarks: no engine, no model to fetch, no bench extra needed
TOOLS = {
    "make-gguf": "write a random-weight GGUF of a real model's shape (Llama-3.2-1B/3B, Llama-3.1-8B, Qwen2.5-1.5B) "
    "in a llama-quantize file type (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0), with a tokenizer of its vocabulary size",
}
EXTRA = ("tqdm", "matplotlib", "openai")  # the `bench` extra of pyproject.toml


def build_parser() -> argparse.ArgumentParser:
    """The `pagedchat bench` parser with one subcommand per benchmark."""
    parser = argparse.ArgumentParser(prog="pagedchat bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, help_text in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--results-dir", default=None, help="where JSON and PNG go (default ./results)")
        p.add_argument("--strict", action="store_true", help="exit with status 1 when a target fails")
        add_engine_args(p)
        _module(name).add_arguments(p)
    for name, help_text in TOOLS.items():
        _module(name).add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _module(name: str):
    """bench/NAME/command.py (make-gguf: bench/make_gguf/): the subcommand's `add_arguments(parser)` and `run(args)`."""
    return importlib.import_module(f"bench.{name.replace('-', '_')}.command")


def missing_extra() -> list[str]:
    """The packages of the `bench` extra that cannot be imported here."""
    return [name for name in EXTRA if importlib.util.find_spec(name) is None]


def bench_main(argv: list[str]) -> int:
    """Parse `argv` (after `bench`) and run the chosen benchmark; with --strict, 1 when a target failed."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.benchmark in TOOLS:
        _module(args.benchmark).run(args)
        return 0
    missing = missing_extra()
    if missing:
        print(
            f"pagedchat bench needs {', '.join(missing)}, not installed here: pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 2
    # the CLI owns logging: engine progress (provisioning, loading) shows as INFO
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in (
        "httpx",
        "httpx2",
        "openai",
        "httpcore",
    ):  # one line per HTTP request would drown the progress bars
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        args.engine_config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:  # a hub id is fetched before any benchmark starts: a bad id is one line
        fetch_model(args.engine_config)
    except ValueError as exc:
        print(f"pagedchat bench: {exc}", file=sys.stderr)
        return 2
    args.command_line = "pagedchat bench " + shlex.join(argv)
    payload = _module(args.benchmark).run(args)
    failed = [t["name"] for t in payload.get("targets", []) if not t["passed"]]
    return 1 if failed and args.strict else 0
