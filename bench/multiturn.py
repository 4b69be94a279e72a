"""`bench multiturn`: N users x K turns sharing a system prompt, via the session API and /v1, caching on and off.

Every user is its own tenant (its own API key, else its own cookie or token), so the prefix cache shares between
users only what the server publishes: the runs with the shared system prompt registered as a published prompt
(`--shared-prompt-file`) reuse it across users; the "unpublished" runs send an unregistered variant of it, which each
user's salted chain must compute once for itself.

`--scenario returning` runs bench/returning/command.py instead: users who come back after their KV blocks left the RAM pool;
`--scenario replicas` (implied by --replicas, --compare-plain, --kill-replica-at) runs bench/replicas/command.py: replica sets
on Ray Serve, per routing policy, Ray's overhead and a failover.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import loadgen, servers
from bench.common import session_client as sc
from bench.common.conversations import Conversation, Latch, bearer_tokens, run_user, user_clients
from bench.common.report import (
    Target,
    mean,
    new_figure,
    percentiles,
    print_report,
    progress,
    targets_payload,
    write_results,
)
from bench.common.workload import ChatRequest, system_prompt, user_turns
from bench.returning import command as returning

TARGET_TTFT_RATIO = 1.5
TARGET_CACHE_HIT_PCT = 90.0
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
SYSTEM_PROMPT_FILE = "shared-system-prompt.txt"
SCENARIOS = ("shared-prompt", "returning", "replicas")
DEFAULT_USERS, DEFAULT_TURNS = 32, 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench multiturn`."""
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="shared-prompt",
        help="shared-prompt: this module's runs; returning: users who come back after their KV blocks left the RAM "
        "pool, with the disk tier, without it and all in RAM, and a restart (bench/returning/command.py); replicas: replica "
        "sets on Ray Serve per routing policy, Ray's overhead, a failover (bench/replicas/command.py; implied by its options)",
    )
    parser.add_argument(
        "--users",
        type=int,
        default=None,
        help=f"default {DEFAULT_USERS} ({returning.DEFAULT_USERS} returning)",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=None,
        help=f"default {DEFAULT_TURNS} ({returning.DEFAULT_TURNS} returning)",
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
        "against it, and compare wall time, output rate and TTFT per turn (bench/multiturn_baseline.py)",
    )
    parser.add_argument(
        "--baseline-name",
        default=None,
        help="the baseline's name in the report (default: llama.cpp when its /v1/models says owned_by llamacpp, "
        "else baseline)",
    )
    parser.add_argument("--keep-logs", default=None, help="keep server logs and databases in this folder")
    returning.add_arguments(parser)
    _replicas().add_arguments(parser)


async def run_mode(
    url: str,
    mode: str,
    api_keys: tuple[str, ...],
    system: str,
    args: argparse.Namespace,
    label: str,
    seed: int,
    *,
    keep_alive: bool = True,
) -> dict[str, Any]:
    """All users' conversations (one task each, one identity each) through one API of one server. `keep_alive=False`:
    every request on its own TCP connection (llama.cpp's small HTTP thread pool starves on idle kept-alive ones)."""
    # distinct conversations per run: only the system prompt is shared between runs on one server
    scripts = [user_turns(u, args.turns, args.seed + seed) for u in range(args.users)]
    warm_token, tokens = bearer_tokens(api_keys, args.users, mode)
    admin_headers = None if keep_alive else {"Connection": "close"}
    async with httpx.AsyncClient(
        base_url=url, timeout=loadgen.CLIENT_TIMEOUT_S, headers=admin_headers
    ) as admin:
        oa = loadgen.make_client(url, warm_token, keep_alive=keep_alive)
        model = (await oa.models.list()).data[0].id
        hello = [{"role": "system", "content": system}, {"role": "user", "content": "Hello!"}]
        warm = await loadgen.stream_chat(oa, model, ChatRequest(hello, 8, "warm"), 0.0)
        await oa.close()
        if not warm.ok:
            raise RuntimeError(f"warm-up request to {url} failed: {warm.error}")
        before = await sc.admin_stats(admin)
        async with user_clients(url, tokens, keep_alive=keep_alive) as clients:
            with progress(args.users * args.turns, label, unit="turn") as bar:
                tick = functools.partial(bar.update, 1)
                starts = [
                    functools.partial(Conversation.open, mode, http, oa, model, system, args.max_tokens)
                    for http, oa in clients
                ]
                measured = Latch(args.users)
                staggered = args.arrivals == "staggered"
                started = time.perf_counter()
                per_user = await asyncio.gather(
                    *(
                        run_user(u, starts[u], script, staggered, measured, tick)
                        for u, script in enumerate(scripts)
                    )
                )
                wall_s = time.perf_counter() - started
        after = await sc.admin_stats(admin)
    return {**summarise(list(per_user), args.turns, before, after), "wall_s": wall_s}


def summarise(
    per_user: list[list[sc.TurnResult]], num_turns: int, before: dict | None, after: dict | None
) -> dict[str, Any]:
    """Per-turn TTFT and prefill numbers, the overall cache hit rate and the last/first TTFT ratio."""
    turns = []
    for k in range(num_turns):
        results = [user[k] for user in per_user if len(user) > k and user[k].ok]
        prompt = sum(r.prompt_tokens for r in results)
        cached = sum(r.cached_tokens for r in results)
        turns.append(
            {
                "turn": k + 1,
                "num_ok": len(results),
                "ttft_ms": {
                    "mean": mean([1000 * r.ttft_s for r in results]),
                    **percentiles([1000 * r.ttft_s for r in results]),
                },
                "server_ttft_ms_p50": percentiles([1000 * r.server_ttft_s for r in results])["p50"],
                "mean_prompt_tokens": mean([r.prompt_tokens for r in results]),
                "mean_cached_tokens": mean([r.cached_tokens for r in results]),
                "mean_prefill_tokens": mean([r.prefill_tokens for r in results]),
                "cache_hit_pct": 100.0 * cached / prompt if prompt else float("nan"),
            }
        )
    every = [r for user in per_user for r in user]
    ok = [r for r in every if r.ok]
    prompt, cached = sum(r.prompt_tokens for r in ok), sum(r.cached_tokens for r in ok)
    summary: dict[str, Any] = {
        "completion_tokens": sum(r.completion_tokens for r in ok),
        "turns": turns,
        "num_turns_failed": len(every) - len(ok),
        "errors": sorted({r.error for r in every if not r.ok})[:5],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "cache_hit_pct": 100.0 * cached / prompt if prompt else float("nan"),
        "ttft_ratio_last_first": turns[-1]["ttft_ms"]["p50"] / turns[0]["ttft_ms"]["p50"],
    }
    if before and after:
        queried = after.get("prefix_query_tokens", 0) - before.get("prefix_query_tokens", 0)
        hit = after.get("prefix_hit_tokens", 0) - before.get("prefix_hit_tokens", 0)
        summary["server_prefix_hit_pct"] = 100.0 * hit / queried if queried else float("nan")
    return summary


def workload_fields(args: argparse.Namespace, system: str) -> dict[str, Any]:
    """The shared-prompt workload's settings, as the result JSONs record them."""
    return {
        "users": args.users,
        "turns": args.turns,
        "system_prompt_chars": len(system),
        "system_tokens_target": args.system_tokens,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "arrivals": args.arrivals,
    }


def _replicas():
    """bench.replicas.command, imported when used: it builds on this module's summarise()."""
    from bench.replicas import command as replicas

    return replicas


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
    replicas = _replicas()
    if args.scenario == "replicas" or replicas.wants_replicas(args):
        if args.scenario == "returning":
            raise SystemExit(
                "bench multiturn: --replicas, --compare-plain and --kill-replica-at are not for --scenario returning"
            )
        return replicas.run(args)
    is_returning = args.scenario == "returning"
    args.users = args.users or (returning.DEFAULT_USERS if is_returning else DEFAULT_USERS)
    args.turns = args.turns or (returning.DEFAULT_TURNS if is_returning else DEFAULT_TURNS)
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
    if args.baseline_url:
        if args.url_no_caching:
            raise SystemExit(
                "bench multiturn: --baseline-url compares one caching pagedchat: no --url-no-caching"
            )
        from bench import multiturn_baseline  # it builds on this module's run_mode

        return multiturn_baseline.run(args, system, bench_keys)
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
