"""`bench multiturn --scenario returning`'s output: TTFT ratios between the runs, the issue's targets, the per-turn
table and the chart; any subset of the runs (in-ram, no-tier, tier), a target needing a missing run left out."""

from __future__ import annotations

import math
from typing import Any

from bench.common.report import Target, new_figure

TARGET_HISTORY_REUSED_PCT = 90.0
TARGET_TTFT_VS_RAM = 2.0
TARGET_RECOMPUTE_VS_TIER = 3.0
TARGET_RESTART_REUSED_PCT = 90.0
RATIOS = {  # name: (numerator run, denominator run)
    "tier_over_in_ram": ("tier", "in-ram"),
    "no_tier_over_tier": ("no-tier", "tier"),
}
HEADERS = [
    "run",
    "turn",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "RAM %",
    "disk %",
    "recomputed %",
    "history reused %",
    "mean prompt",
    "ok",
]


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else float("nan")


def ttft_ratios(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per returning turn (2 on): TTFT p50 of the tier run over the in-RAM run's, of the no-tier run over the
    tier's; a ratio is there when both its runs are."""
    p50 = {name: [t["ttft_ms"]["p50"] for t in r["turns"]] for name, r in runs.items()}
    num_turns = max((len(v) for v in p50.values()), default=0)
    return [
        {"turn": k + 1}
        | {name: _ratio(p50[a][k], p50[b][k]) for name, (a, b) in RATIOS.items() if a in p50 and b in p50}
        for k in range(1, num_turns)
    ]


def make_targets(runs: dict[str, dict[str, Any]], restart_after: int) -> list[Target]:
    """The issue's claims: history reuse with the tier, TTFT against a RAM hit and against recompute at the last
    turn (the longest histories), and reuse after the restart."""
    if "tier" not in runs:
        return []
    tier = runs["tier"]
    last = (ttft_ratios(runs) or [{}])[-1]
    k = len(tier["turns"])
    targets = [
        Target(
            "tier: returning users' history tokens served from RAM or disk %",
            tier["returning_history_reused_pct"],
            TARGET_HISTORY_REUSED_PCT,
        )
    ]
    if "tier_over_in_ram" in last:
        targets.append(
            Target(
                f"tier: turn {k} TTFT p50 / in-RAM hit's", last["tier_over_in_ram"], TARGET_TTFT_VS_RAM, "<="
            )
        )
    if "no_tier_over_tier" in last:
        targets.append(
            Target(
                f"no tier (recompute): turn {k} TTFT p50 / tier's",
                last["no_tier_over_tier"],
                TARGET_RECOMPUTE_VS_TIER,
            )
        )
    if restart_after:
        turn = tier["turns"][restart_after]
        targets.append(
            Target(
                f"tier: turn {turn['turn']}, after the restart: history reused by the least conversation %",
                turn["history_reused_min_pct"],
                TARGET_RESTART_REUSED_PCT,
            )
        )
    return targets


def table_rows(runs: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """One row per run and turn; the turn after the restart is marked."""
    return [
        [
            name,
            f"{t['turn']}{' (restart)' if t['after_restart'] else ''}",
            t["ttft_ms"]["p50"],
            t["ttft_ms"]["p99"],
            t["share_pct"]["ram"],
            t["share_pct"]["disk"],
            t["share_pct"]["recomputed"],
            t["history_reused_pct"],
            t["mean_prompt_tokens"],
            t["num_ok"],
        ]
        for name, r in runs.items()
        for t in r["turns"]
    ]


def plot(runs: dict[str, dict[str, Any]]):
    """TTFT p50 per turn of every run; where the tier run's prompt tokens came from, per turn."""
    fig, (ax_ttft, ax_share) = new_figure(ncols=2)
    turns: list[int] = []
    for name, r in runs.items():
        turns = [t["turn"] for t in r["turns"]]
        ax_ttft.plot(turns, [t["ttft_ms"]["p50"] for t in r["turns"]], "o-", label=name)
    source = runs.get("tier") or next(iter(runs.values()))
    for part in ("ram", "disk", "recomputed"):
        ax_share.plot(turns, [t["share_pct"][part] for t in source["turns"]], "o-", label=part)
    ax_ttft.set_title("time to first token (p50 over users)")
    ax_ttft.set_ylabel("ms")
    ax_ttft.set_yscale("log")
    ax_share.set_title(f"{'tier' if 'tier' in runs else next(iter(runs))} run: prompt tokens by source")
    ax_share.set_ylabel("% of prompt tokens")
    for ax in (ax_ttft, ax_share):
        ax.set_xticks(turns)
        ax.set_xlabel("turn")
        ax.legend(fontsize=8)
    return fig
