"""`bench multiturn --replicas`' report: one summary per run, Ray's overhead, the failover's outcome, the targets,
the tables and the chart, and the payload written as JSON + PNG."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.common.report import (
    Target,
    format_table,
    mean,
    new_figure,
    percentiles,
    print_report,
    targets_payload,
    write_results,
)
from bench.multiturn import runs as multiturn_runs
from bench.replicas.failover import sort_requests
from bench.replicas.load import LoadResult, RequestRecord, throughput
from bench.replicas.metrics import (
    by_replica,
    delta,
    replica_hit_pct,
    routed_counts,
    routing_summary,
)
from bench.replicas.scenario import Scenario

TARGET_CACHE_HIT_PCT = (
    multiturn_runs.TARGET_CACHE_HIT_PCT
)  # issue #19: kv routing keeps >= 90% of prompt tokens cached
TARGET_RAY_OVERHEAD = 1.10  # issue #19: Ray's own overhead <= 10%
HEADERS = [
    "run",
    "replicas",
    "routing",
    "cached prompt %",
    "to longest prefix %",
    "load fallback",
    "turn 1 TTFT p50 ms",
    "last turn TTFT p50 ms",
    "TTFT p99 ms",
    "output tok/s",
    "failed requests",
]


def summarise_run(
    load: LoadResult, num_turns: int, metrics_before: str, metrics_after: str, server: Mapping[str, Any]
) -> dict[str, Any]:
    """One run: multiturn's per-turn TTFT and cache numbers, all measured turns' TTFT, throughput, the routing
    decisions over the run and each replica's prefix hit rate (a restarted replica's counters count from 0)."""
    summary = multiturn_runs.summarise(load.per_user, num_turns, None, None)
    ttft = [1000 * r.ttft_s for user in load.per_user for r in user if r.ok]
    summary["ttft_ms_all"] = {"mean": mean(ttft), **percentiles(ttft)}
    summary["throughput"] = throughput(load.records)
    summary["routing"] = routing_summary(delta(routed_counts(metrics_before), routed_counts(metrics_after)))
    hits, queries = (
        delta(by_replica(metrics_before, name), by_replica(metrics_after, name), allow_reset=True)
        for name in ("prefix_cache_hits_total", "prefix_cache_queries_total")
    )
    summary["replica_prefix_hit_pct"] = replica_hit_pct(hits, queries)
    summary["server"] = dict(server)
    return summary


def overhead(plain: Mapping[str, Any], ray: Mapping[str, Any]) -> dict[str, float]:
    """Ray's cost at equal threads and equal load: TTFT ratios (Ray / plain) and the throughput ratio (plain / Ray):
    1.0 is no overhead."""

    def ratio(a: float, b: float) -> float:
        return a / b if b and not math.isnan(b) else math.nan

    p, r = plain["ttft_ms_all"], ray["ttft_ms_all"]
    return {
        "ttft_p50_ratio": ratio(r["p50"], p["p50"]),
        "ttft_p99_ratio": ratio(r["p99"], p["p99"]),
        "throughput_ratio": ratio(
            plain["throughput"]["output_tokens_per_s"], ray["throughput"]["output_tokens_per_s"]
        ),
    }


def failover_summary(
    killed: Mapping[str, Any], records: Sequence[RequestRecord], kill_s: float, num_turns_failed: int
) -> dict[str, Any]:
    """What the kill did: the killer's account (which replica, its load, /health's timeline, recovery), the requests
    sorted around the kill, and measured turns that failed even after their one resend."""
    return {**killed, "requests": sort_requests(records, kill_s), "num_turns_failed": num_turns_failed}


def make_targets(
    runs: Mapping[str, Mapping[str, Any]],
    ray_overhead: Mapping[str, float] | None,
    failover: Mapping[str, Any] | None,
    recovery_timeout_s: float,
) -> list[Target]:
    """The issue's claims that this invocation measured."""
    targets = []
    if "routing/kv" in runs:
        targets.append(
            Target(
                "kv routing: prompt tokens from the cache %",
                runs["routing/kv"]["cache_hit_pct"],
                TARGET_CACHE_HIT_PCT,
            )
        )
    if ray_overhead is not None:
        targets += [
            Target(
                "Ray, 1 replica: TTFT p50 / the plain process's",
                ray_overhead["ttft_p50_ratio"],
                TARGET_RAY_OVERHEAD,
                "<=",
            ),
            Target(
                "the plain process's output tokens/s / Ray's (1 replica)",
                ray_overhead["throughput_ratio"],
                TARGET_RAY_OVERHEAD,
                "<=",
            ),
        ]
    if failover is not None:
        requests = failover["requests"]
        recovered = failover["recovered_s"]
        targets += [
            Target(
                "failover: failed requests that were not in flight at the kill",
                requests["before"]["num_failed"] + requests["after"]["num_failed"],
                0,
                "<=",
            ),
            Target("failover: measured turns failed after one resend", failover["num_turns_failed"], 0, "<="),
            Target(
                "failover: seconds until /health showed every replica ready again",
                math.nan if recovered is None else recovered,
                recovery_timeout_s,
                "<=",
            ),
        ]
    return targets


def table_rows(runs: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """One row per run, HEADERS' columns."""
    rows = []
    for name, r in runs.items():
        routing = r["routing"]
        rows.append(
            [
                name,
                r["server"]["replicas"],
                r["server"]["routing"],
                r["cache_hit_pct"],
                routing["longest_prefix_pct"],
                routing["by_outcome"]["load_fallback"],
                r["turns"][0]["ttft_ms"]["p50"],
                r["turns"][-1]["ttft_ms"]["p50"],
                r["ttft_ms_all"]["p99"],
                r["throughput"]["output_tokens_per_s"],
                r["throughput"]["num_failed"],
            ]
        )
    return rows


def per_turn_table(runs: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Per turn, for each run: TTFT p50 and p99 (ms) and the prompt tokens from the cache (%)."""
    headers = ["turn"]
    for name in runs:
        headers += [f"{name} p50", "p99", "cached %"]
    num_turns = min(len(r["turns"]) for r in runs.values())
    rows = []
    for k in range(num_turns):
        row: list[Any] = [k + 1]
        for r in runs.values():
            turn = r["turns"][k]
            row += [turn["ttft_ms"]["p50"], turn["ttft_ms"]["p99"], turn["cache_hit_pct"]]
        rows.append(row)
    return headers, rows


def failover_lines(failover: Mapping[str, Any]) -> list[str]:
    """The failover run in a few lines: what was killed, what failed, when /health recovered."""
    req = failover["requests"]
    load = failover["replica_load_at_kill"]
    recovered = failover["recovered_s"]
    lines = [
        f"killed replica {failover['replica']} (pid {failover['pid']}) when the first user started turn "
        f"{failover['at_turn']} (+{failover['delay_s']:.2f} s); its running + waiting requests then: "
        f"{'unknown' if load is None else int(load)}",
        f"requests ended before the kill: {req['before']['num']} ({req['before']['num_failed']} failed); in flight at "
        f"it: {req['in_flight']['num']} ({req['in_flight']['num_failed']} failed); sent after it: "
        f"{req['after']['num']} ({req['after']['num_failed']} failed)",
        "recovery: /health degraded after "
        + ("(never seen)" if failover["degraded_s"] is None else f"{failover['degraded_s']:.2f} s")
        + ", whole again after "
        + ("(not within the timeout)" if recovered is None else f"{recovered:.1f} s"),
        f"measured turns failed after one resend: {failover['num_turns_failed']}",
    ]
    for f in req["failed"][:10]:
        lines.append(
            f"  failed ({f['group']}): user {f['user']} conversation {f['conversation']} turn {f['turn'] + 1} "
            f"attempt {f['attempt']}, sent {f['sent_s']:+.2f} s, ended {f['done_s']:+.2f} s: {f['error']}"
        )
    return lines


def plot(runs: Mapping[str, Mapping[str, Any]]):
    """TTFT p50 and the cached share of prompt tokens per turn, one line per run."""
    fig, (ax_ttft, ax_cached) = new_figure(ncols=2)
    for name, r in runs.items():
        x = [t["turn"] for t in r["turns"]]
        ax_ttft.plot(x, [t["ttft_ms"]["p50"] for t in r["turns"]], "o-", label=name)
        ax_cached.plot(x, [t["cache_hit_pct"] for t in r["turns"]], "o-", label=name)
    ax_ttft.set_title("time to first token (p50 over users)")
    ax_ttft.set_ylabel("ms")
    ax_cached.set_title("prompt tokens from the prefix cache")
    ax_cached.set_ylabel("%")
    ax_cached.set_ylim(0, 100)
    turns = sorted({t["turn"] for r in runs.values() for t in r["turns"]})
    for ax in (ax_ttft, ax_cached):
        ax.set_xticks(turns)
        ax.set_xlabel("turn")
        ax.legend(fontsize=8)
    return fig


def report(runs: dict[str, dict[str, Any]], scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """The payload (written as JSON + PNG) and the printed tables and targets."""
    ray_overhead = (
        overhead(runs["overhead/plain"], runs["overhead/ray"])
        if "overhead/plain" in runs and "overhead/ray" in runs
        else None
    )
    failover = next((r["failover"] for r in runs.values() if "failover" in r), None)
    targets = make_targets(runs, ray_overhead, failover, args.recovery_timeout_s)
    payload = {
        "model": args.engine_config.model,
        "workload": {
            "label": "synthetic: templated support-chat conversations through /v1, history resent every turn",
            "users": scenario.num_users,
            "turns": scenario.num_turns,
            "system_prompts": len(scenario.system_prompts),
            "system_prompt_chars": [len(p) for p in scenario.system_prompts],
            "system_tokens_target": args.system_tokens,
            "user_tokens": args.user_tokens or "short questions",
            "max_tokens": args.max_tokens,
            "temperature": 0.0,
            "arrivals": args.arrivals,
            "identities": "one API key per user (its own cache tenant); the system prompts are published",
        },
        "replicas": args.replicas,
        "threads_per_replica": args.threads_per_replica,
        "ray_address": args.ray_address,
        "runs": runs,
        "ray_overhead": ray_overhead,
        "failover": failover,
        "targets": targets_payload(targets),
    }
    paths = write_results("multiturn-replicas", payload, plot(runs), args.results_dir, args.command_line)
    title = f"multiturn, replicas: {scenario.num_users} users x {scenario.num_turns} turns through /v1"
    print(f"\n== {title}: per turn ==")
    print(format_table(*per_turn_table(runs)))
    if ray_overhead is not None:
        print(
            "\nRay overhead (1 replica vs the plain process): "
            + ", ".join(f"{k} {v:.3f}" for k, v in ray_overhead.items())
        )
    if failover is not None:
        print("\nfailover:\n" + "\n".join(failover_lines(failover)))
    print_report(title, HEADERS, table_rows(runs), targets, paths)
    return payload
