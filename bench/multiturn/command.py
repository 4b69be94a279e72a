"""`bench multiturn`: N users x K turns sharing a system prompt, via the session API and /v1, caching on and off.

Every user is its own tenant (its own API key, else its own cookie or token), so the prefix cache shares between
users only what the server publishes: the runs with the shared system prompt registered as a published prompt
(`--shared-prompt-file`) reuse it across users; the "unpublished" runs send an unregistered variant of it, which each
user's salted chain must compute once for itself.

`--scenario returning` runs bench/returning/ instead: users who come back after their KV blocks left the RAM pool;
`--scenario replicas` (implied by --replicas, --compare-plain, --kill-replica-at) runs bench/replicas/: replica sets
on Ray Serve, per routing policy, Ray's overhead and a failover; `--baseline-url` runs bench/multiturn/baseline.py.
Each builds on bench/multiturn/runs.py, which imports none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from bench.common import servers
from bench.common.report import Target, new_figure, print_report, targets_payload, write_results
from bench.common.workload import system_prompt
from bench.multiturn import baseline, document
from bench.multiturn.runs import SYSTEM_PROMPT_FILE, TARGET_CACHE_HIT_PCT, run_mode, workload_fields
from bench.replicas import command as replicas
from bench.returning import command as returning

TARGET_TTFT_RATIO = 1.5
MODES = ("session", "v1")
ARRIVALS = ("staggered", "together")
ARRIVALS_MEANING = {
    "staggered": "every user chats back to back for the whole run; user u's measured conversation starts after "
    "u mod K unmeasured turns of another one, and users keep chatting (unmeasured) until all measured "
    "conversations are done: the measured turn 1 and turn K see the same number of users",
    "together": "every user starts its measured conversation in the same instant; turn 1 is a burst",
}
BENCH_API_KEY = "pagedchat-bench"
UNPUBLISHED_PREAMBLE = (
    "(Unpublished draft for {api}.) "  # starts the unregistered variants of the system prompt
)
SCENARIOS = ("shared-prompt", "document", "returning", "replicas")
DEFAULT_USERS, DEFAULT_TURNS = 32, 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench multiturn`."""
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="shared-prompt",
        help="shared-prompt: this module's runs; document: every user sends a document, then asks questions about "
        "it (bench/multiturn/document.py; with --baseline-url, against that server too); returning: users who come back after their KV blocks left the RAM "
        "pool, with the disk tier, without it and all in RAM, and a restart (bench/returning/); replicas: replica "
        "sets on Ray Serve per routing policy, Ray's overhead, a failover (bench/replicas/; implied by its options)",
    )
    parser.add_argument(
        "--users",
        type=int,
        default=None,
        help=f"default {DEFAULT_USERS} ({document.DEFAULT_USERS} document, {returning.DEFAULT_USERS} returning)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=None,
        help=f"default {DEFAULT_TURNS} ({document.DEFAULT_TURNS} document, {returning.DEFAULT_TURNS} returning)",
    )
    parser.add_argument(
        "--document-tokens",
        type=int,
        default=document.DEFAULT_DOCUMENT_TOKENS,
        help="--scenario document: the length of each user's document",
    )
    parser.add_argument("--system-tokens", type=int, default=400, help="length of the shared system prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every answer")
    parser.add_argument(
        "--arrivals",
        choices=ARRIVALS,
        default="staggered",
        help="staggered: all users chat all the time, their measured conversations out of phase, so every turn "
        "number sees the same load; together: every user starts its conversation in the same instant",
    )
    parser.add_argument("--url", default=None, help="a running pagedchat server with prefix caching on")
    parser.add_argument(
        "--url-no-caching", default=None, help="a running pagedchat server with prefix caching off"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="API keys of servers given by URL, comma-separated: the first is the warm-up's, user u sends key u+1 "
        "(modulo their number; users + 1 keys give every user its own)",
    )
    parser.add_argument(
        "--write-system-prompt",
        default=None,
        metavar="PATH",
        help="write the shared system prompt to PATH and exit: servers given by --url publish it with "
        "--shared-prompt-file PATH",
    )
    parser.add_argument(
        "--baseline-url",
        default=None,
        help="any running OpenAI-compatible server (e.g. llama.cpp's llama-server): run the same users' /v1 "
        "conversations against pagedchat (caching on, the system prompt published; --url or started here) and "
        "against it, and compare wall time, output rate and TTFT per turn (bench/multiturn/baseline.py)",
    )
    parser.add_argument(
        "--baseline-name",
        default=None,
        help="the baseline's name in the report (default: llama.cpp when its /v1/models says owned_by llamacpp, "
        "else baseline)",
    )
    parser.add_argument("--keep-logs", default=None, help="keep server logs and databases in this folder")
    returning.add_arguments(parser)
    replicas.add_arguments(parser)


def shared_system_prompt(model: str, system_tokens: int, *, revision: str = "", gguf_file: str = "") -> str:
    """The benchmark's shared system prompt in `model`'s tokenizer: the text servers publish."""
    from engine.loading.loader import load_tokenizer, resolve_model_path

    path = resolve_model_path(model, revision=revision, gguf_file=gguf_file)
    return system_prompt(load_tokenizer(path), system_tokens)


def _runs_on(
    url: str, caching: str, api_keys: tuple[str, ...], system: str, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Both APIs on one server; on a caching one also both with an unpublished variant of the system prompt."""
    runs: dict[str, dict[str, Any]] = {}
    for variant, suffix in enumerate(("", "-unpublished") if caching == "on" else ("",)):
        for i, mode in enumerate(MODES):
            # one variant per API: a user's session run must not warm its own /v1 run's unpublished prompt
            text = UNPUBLISHED_PREAMBLE.format(api=mode) + system if suffix else system
            name = f"{mode}/caching-{caching}{suffix}"
            label = f"{mode}, caching {caching}{', unpublished' if suffix else ''}"
            seed = 1000 * (len(MODES) * variant + i)
            runs[name] = asyncio.run(run_mode(url, mode, api_keys, text, args, label, seed))
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both APIs on a caching and a non-caching server (started here, one after the other, unless URLs are given);
    or the returning or the replicas scenario."""
    if args.scenario == "replicas" or replicas.wants_replicas(args):
        if args.scenario == "returning":
            raise SystemExit(
                "bench multiturn: --replicas, --compare-plain and --kill-replica-at are not for --scenario returning"
            )
        return replicas.run(args)
    is_returning = args.scenario == "returning"
    defaults = {"returning": returning, "document": document}.get(args.scenario)
    args.users = args.users or (defaults.DEFAULT_USERS if defaults else DEFAULT_USERS)
    args.turns = args.turns or (defaults.DEFAULT_TURNS if defaults else DEFAULT_TURNS)
    if is_returning:
        if args.url or args.url_no_caching or args.write_system_prompt or args.baseline_url:
            raise SystemExit(
                "bench multiturn --scenario returning starts (and restarts) its own servers: no --url or "
                "--baseline-url"
            )
        return returning.run(args)
    config = args.engine_config
    system = shared_system_prompt(
        config.model, args.system_tokens, revision=config.model_revision, gguf_file=config.gguf_file
    )
    if args.write_system_prompt:
        Path(args.write_system_prompt).write_text(system, encoding="utf-8")
        print(f"wrote the shared system prompt ({len(system)} characters) to {args.write_system_prompt}")
        return {}
    url_keys = tuple(k.strip() for k in (args.api_key or "").split(",") if k.strip())
    # servers started here: one key per user and one for the warm-up, and the system prompt published
    bench_keys = tuple(f"{BENCH_API_KEY}-{u}" for u in range(args.users + 1))
    if args.scenario == "document":
        if args.url_no_caching:
            raise SystemExit(
                "bench multiturn --scenario document runs one caching pagedchat: no --url-no-caching"
            )
        return document.run(args, system, bench_keys)
    if args.baseline_url:
        if args.url_no_caching:
            raise SystemExit(
                "bench multiturn: --baseline-url compares one caching pagedchat: no --url-no-caching"
            )
        return baseline.run(args, system, bench_keys)
    runs: dict[str, dict[str, Any]] = {}
    with servers.log_folder(args.keep_logs) as logs:
        prompt_file = logs / SYSTEM_PROMPT_FILE
        prompt_file.write_text(system, encoding="utf-8")
        env = {"PAGEDCHAT_API_KEYS": ",".join(bench_keys), "PAGEDCHAT_SHARED_PROMPT_FILES": str(prompt_file)}
        for caching, url in (("on", args.url), ("off", args.url_no_caching)):
            if url is not None:
                runs.update(_runs_on(url, caching, url_keys, system, args))
                continue
            # the RAM prefix cache alone: the runs on one server share user identities, and a disk tier would
            # bring one run's evicted blocks back in the next (the returning-users scenario measures the tier)
            cfg = dataclasses.replace(config, enable_prefix_caching=caching == "on", kv_disk_bytes=0)
            server = servers.start_pagedchat(f"pagedchat-caching-{caching}", cfg, logs, env)
            with servers.running([server]):
                runs.update(_runs_on(server.base_url, caching, bench_keys, system, args))
    on = runs["session/caching-on"]
    targets = [
        Target(
            f"session API, caching on: turn {args.turns} TTFT / turn 1 TTFT",
            on["ttft_ratio_last_first"],
            TARGET_TTFT_RATIO,
            "<=",
        ),
        Target(
            "session API, caching on: prompt tokens from the cache %",
            on["cache_hit_pct"],
            TARGET_CACHE_HIT_PCT,
        ),
    ]
    payload = {
        "model": config.model,
        "workload": {
            "label": "synthetic: templated support-chat conversations",
            **workload_fields(args, system),
            "arrivals_meaning": ARRIVALS_MEANING[args.arrivals],
            "warmup": "one /v1 request with the run's system prompt before each run, under its own identity",
            "identities": "one per user (its own API key, else its own cookie or /v1 token): the prefix cache "
            "shares only published prompts between users",
            "unpublished": "the *-unpublished runs send an unregistered variant of the system prompt",
        },
        "published_prompt_cache_hit_pct": {
            mode: {
                "published": runs[f"{mode}/caching-on"]["cache_hit_pct"],
                "unpublished": runs[f"{mode}/caching-on-unpublished"]["cache_hit_pct"],
            }
            for mode in MODES
        },
        "runs": runs,
        "targets": targets_payload(targets),
    }
    paths = write_results("multiturn", payload, _plot(runs, args.turns), args.results_dir, args.command_line)
    rows = [
        [
            name,
            r["turns"][0]["ttft_ms"]["p50"],
            r["turns"][-1]["ttft_ms"]["p50"],
            r["ttft_ratio_last_first"],
            r["cache_hit_pct"],
            r["prefill_tokens"],
            r["num_turns_failed"],
        ]
        for name, r in runs.items()
    ]
    headers = [
        "API / caching",
        "turn 1 TTFT p50 ms",
        f"turn {args.turns} TTFT p50 ms",
        "ratio",
        "cached prompt %",
        "prefill tokens",
        "failed",
    ]
    print_report(
        f"multiturn: {args.users} users x {args.turns} turns, {args.system_tokens}-token system prompt",
        headers,
        rows,
        targets,
        paths,
    )
    return payload


def _plot(runs: dict[str, dict[str, Any]], num_turns: int):
    fig, (ax_ttft, ax_prefill) = new_figure(ncols=2)
    x = list(range(1, num_turns + 1))
    for name, r in runs.items():
        style = "-" if name.endswith("caching-on") else "--"
        ax_ttft.plot(x, [t["ttft_ms"]["p50"] for t in r["turns"]], "o" + style, label=name)
        ax_prefill.plot(x, [t["mean_prefill_tokens"] for t in r["turns"]], "o" + style, label=name)
    ax_ttft.set_title("time to first token (p50 over users)")
    ax_ttft.set_ylabel("ms")
    ax_ttft.set_yscale("log")
    ax_prefill.set_title("prompt tokens computed per turn (mean)")
    ax_prefill.set_ylabel("tokens")
    for ax in (ax_ttft, ax_prefill):
        ax.set_xticks(x)
        ax.set_xlabel("turn")
        ax.legend(fontsize=8)
    return fig
