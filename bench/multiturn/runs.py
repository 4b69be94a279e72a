"""One `bench multiturn` run: every user's conversation through one API of one server, and its per-turn summary.
The shared-prompt runs and the baseline comparison (bench/multiturn/baseline.py) run it; the replica sets
(bench/replicas/report.py) summarise their turns with it too."""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from typing import Any

import httpx

from bench.common import loadgen
from bench.common import session_client as sc
from bench.common.conversations import Conversation, Latch, bearer_tokens, run_user, user_clients
from bench.common.report import mean, percentiles, progress
from bench.common.workload import ChatRequest, user_turns

TARGET_CACHE_HIT_PCT = 90.0
SYSTEM_PROMPT_FILE = "shared-system-prompt.txt"


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
    scripts: list[list[str]] | None = None,
) -> dict[str, Any]:
    """All users' conversations (one task each, one identity each) through one API of one server. `keep_alive=False`:
    every request on its own TCP connection (llama.cpp's small HTTP thread pool starves on idle kept-alive ones).
    `scripts`: each user's messages (default: the templated support chat of `seed`)."""
    if (
        scripts is None
    ):  # distinct conversations per run: only the system prompt is shared between runs on one server
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


def later_turns_cache_pct(run: dict[str, Any]) -> float:
    """The share of turns 2..K's prompt tokens that came from the cache (turn 1 reads what is new)."""
    later = run["turns"][1:]
    prompt = sum(t["mean_prompt_tokens"] * t["num_ok"] for t in later)
    cached = sum(t["mean_cached_tokens"] * t["num_ok"] for t in later)
    return 100.0 * cached / prompt if prompt else float("nan")


def later_turns_ttft_ms(run: dict[str, Any]) -> float:
    """The mean over turns 2..K of each turn's TTFT p50."""
    later = [t["ttft_ms"]["p50"] for t in run["turns"][1:]]
    return sum(later) / len(later) if later else float("nan")
