"""`bench multiturn --scenario returning`'s numbers: where each turn's prompt tokens came from (RAM, disk, computed),
how much of each conversation's history was reused, and the server counters the RAM/disk split is read from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.common import session_client as sc
from bench.common.report import mean, percentiles

QUERIES_METRIC = "pagedchat:prefix_cache_queries_total"
HITS_METRIC = "pagedchat:prefix_cache_hits_total"
DISK_HITS_METRIC = 'pagedchat:prefix_cache_hits_by_tier_total{tier="disk"}'
DISK_FROM_COUNTERS = "server counters"
DISK_AFTER_RESTART = "restart: a new process holds nothing in RAM, so every hit came from the disk"


@dataclass(frozen=True)
class HitCounters:
    """A server's prefix-cache counters (prompt tokens since it started); disk None where the server hides it."""

    query_tokens: int
    hit_tokens: int  # from RAM or disk
    disk_hit_tokens: int | None

    def minus(self, before: HitCounters) -> HitCounters:
        """What happened between `before` and this reading (same process: counters only grow)."""
        disk = None
        if self.disk_hit_tokens is not None and before.disk_hit_tokens is not None:
            disk = self.disk_hit_tokens - before.disk_hit_tokens
        return HitCounters(self.query_tokens - before.query_tokens, self.hit_tokens - before.hit_tokens, disk)


def hit_counters(admin: dict[str, Any] | None, metrics: dict[str, float] | None) -> HitCounters | None:
    """The one place that maps the server's names to counters: the admin API's `stats` (EngineStats' fields), else
    the Prometheus metrics (app/metrics/metrics.py)."""
    if admin and "prefix_hit_tokens" in admin:
        disk = admin.get("disk_hit_tokens")
        return HitCounters(
            int(admin["prefix_query_tokens"]),
            int(admin["prefix_hit_tokens"]),
            None if disk is None else int(disk),
        )
    if not metrics or HITS_METRIC not in metrics:
        return None
    disk = metrics.get(DISK_HITS_METRIC)
    return HitCounters(
        int(metrics.get(QUERIES_METRIC, 0)), int(metrics[HITS_METRIC]), None if disk is None else int(disk)
    )


def parse_metrics(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition (prometheus_client's parser) by name and labels, the `model_name`
    label left out: `pagedchat:prefix_cache_hits_total`, `pagedchat:prefix_cache_hits_by_tier_total{tier="disk"}`."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kept = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "model_name")
            values[f"{sample.name}{{{kept}}}" if kept else sample.name] = float(sample.value)
    return values


async def read_metrics(client: httpx.AsyncClient) -> dict[str, float] | None:
    """GET /metrics parsed, or None when the server refuses us."""
    try:
        resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return parse_metrics(resp.text) if resp.status_code == 200 else None


async def read_hit_counters(client: httpx.AsyncClient) -> HitCounters | None:
    """The server's counters now: the admin API's, or /metrics' when the admin API does not give the disk's."""
    admin = await sc.admin_stats(client)
    counters = hit_counters(admin, None)
    if counters is not None and counters.disk_hit_tokens is not None:
        return counters
    return hit_counters(None, await read_metrics(client)) or counters


def disk_split(
    delta: HitCounters | None, cached_tokens: int, after_restart: bool
) -> tuple[int | None, str | None]:
    """A round's prompt tokens read from the disk tier and how that is known: the counters' difference, or, on the
    first round after a restart, every hit (each user is its own cache tenant, so nobody else loaded its blocks)."""
    if delta is not None and delta.disk_hit_tokens is not None:
        return delta.disk_hit_tokens, DISK_FROM_COUNTERS
    if after_restart:
        return cached_tokens, DISK_AFTER_RESTART
    return None, None


def share_pct(prompt_tokens: int, cached_tokens: int, disk_tokens: int | None) -> dict[str, float]:
    """Shares of prompt tokens served from RAM, read from disk, and recomputed (NaN where unknown)."""
    if prompt_tokens <= 0:
        return dict.fromkeys(("ram", "disk", "recomputed"), float("nan"))
    disk = float("nan") if disk_tokens is None else 100.0 * disk_tokens / prompt_tokens
    ram = float("nan") if disk_tokens is None else 100.0 * (cached_tokens - disk_tokens) / prompt_tokens
    return {"ram": ram, "disk": disk, "recomputed": 100.0 * (prompt_tokens - cached_tokens) / prompt_tokens}


def history_tokens(previous: sc.TurnResult) -> int:
    """Tokens of a conversation's history at its next turn: the previous prompt and its answer."""
    return previous.prompt_tokens + previous.completion_tokens


def ttft_ms(result: sc.TurnResult) -> float:
    """Time to the first token; a reply that ended at its first token (no text) took its whole time."""
    return 1000 * (result.e2e_s if math.isnan(result.ttft_s) else result.ttft_s)


def summarise_turn(
    turn: int,
    results: Sequence[sc.TurnResult],
    previous: Sequence[sc.TurnResult] | None,
    delta: HitCounters | None,
    after_restart: bool = False,
) -> dict[str, Any]:
    """One round (every user's turn `turn`): TTFT, token shares, and how much of each history was reused.

    `previous`: the users' turn before (None for the first), in the same order as `results`.
    """
    ok = [r for r in results if r.ok]
    prompt, cached = sum(r.prompt_tokens for r in ok), sum(r.cached_tokens for r in ok)
    disk, source = disk_split(delta, cached, after_restart)
    returning = [(r, p) for r, p in zip(results, previous or [], strict=False) if r.ok and p.ok]
    history = sum(history_tokens(p) for _, p in returning)
    per_user = [100.0 * r.cached_tokens / history_tokens(p) for r, p in returning if history_tokens(p)]
    times = [ttft_ms(r) for r in ok]
    return {
        "turn": turn,
        "after_restart": after_restart,
        "num_ok": len(ok),
        "ttft_ms": {"mean": mean(times), **percentiles(times)},
        "mean_prompt_tokens": mean([r.prompt_tokens for r in ok]),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "disk_tokens": disk,
        "disk_split_source": source,
        "share_pct": share_pct(prompt, cached, disk),
        "history_tokens": history,
        "history_cached_tokens": sum(r.cached_tokens for r, _ in returning),
        "history_reused_pct": 100.0 * sum(r.cached_tokens for r, _ in returning) / history
        if history
        else float("nan"),
        "history_reused_min_pct": min(per_user, default=float("nan")),
    }


def summarise_run(per_turn: list[dict[str, Any]], results: list[list[sc.TurnResult]]) -> dict[str, Any]:
    """A run's rounds, its failures and the share of returning users' history tokens served from RAM or disk."""
    every = [r for round_ in results for r in round_]
    history = sum(t["history_tokens"] for t in per_turn)
    reused = sum(t["history_cached_tokens"] for t in per_turn)
    return {
        "turns": per_turn,
        "num_turns_failed": sum(not r.ok for r in every),
        "errors": sorted({r.error for r in every if not r.ok})[:5],
        "returning_history_reused_pct": 100.0 * reused / history if history else float("nan"),
    }
