"""`bench serving`'s output: pagedchat ÷ baseline ratios per shared load point, the report table and the chart, for
any mix of Poisson-rate and closed-loop-concurrency points."""

from __future__ import annotations

import math
from typing import Any

from bench.common.report import new_figure

HEADERS = [
    "server",
    "load",
    "reqs",
    "req/s",
    "out tok/s",
    "TTFT p50 ms",
    "TTFT p99",
    "TPOT p50 ms",
    "ITL p50 ms",
    "ITL p99",
    "E2E p50 ms",
    "E2E p99",
    "server ms/tok",
    "failed",
]
RATIOS_MEANING = (
    "output_tokens_per_s: pagedchat / baseline; ttft_p50: baseline / pagedchat (above 1: pagedchat is better on "
    "both); one entry per load point both systems ran"
)
STYLES = {"rate": ("o-", "x:"), "concurrency": ("s--", "+:")}  # (p50, p99) line styles per kind of load


MEMORY_HEADERS = ["server", "RSS MB", "peak RSS MB"]


def memory_rows(served: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """One row per server whose memory was read (the one started here, or a --pid / --baseline-pid)."""
    return [
        [name, round(m["rss_bytes"] / 1e6), round(m["peak_rss_bytes"] / 1e6)]
        for name, info in served.items()
        if (m := info.get("memory"))
    ]


def point_key(point: dict[str, Any]) -> str:
    """`rate=2` or `concurrency=16`: how ratios and the report name a load point."""
    return f"{point['load']}={point['value']:g}"


def ratios(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per load point both sweeps ran: pagedchat ÷ baseline output tok/s, baseline ÷ pagedchat TTFT p50."""
    base = {point_key(p): p for p in theirs}
    return {
        point_key(p): {
            "output_tokens_per_s": _ratio(p["output_tokens_per_s"], b["output_tokens_per_s"]),
            "ttft_p50": _ratio(b["ttft_ms"]["p50"], p["ttft_ms"]["p50"]),
        }
        for p in ours
        if (b := base.get(point_key(p))) is not None
    }


def _ratio(a: float, b: float) -> float:
    """a / b; NaN (null in the JSON) when either is missing or b is 0."""
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return float("nan")
    return a / b


def table_rows(systems: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    """One row per system and load point, in HEADERS' order; "-" where the server reports no own timings."""
    return [
        [
            name,
            point_key(p),
            p["num_requests"],
            p["requests_per_s"],
            p["output_tokens_per_s"],
            p["ttft_ms"]["p50"],
            p["ttft_ms"]["p99"],
            p["tpot_ms"]["p50"],
            p["itl_ms"]["p50"],
            p["itl_ms"]["p99"],
            p["e2e_ms"]["p50"],
            p["e2e_ms"]["p99"],
            p["server_predicted_per_token_ms"]["p50"] if "server_predicted_per_token_ms" in p else "-",
            p["num_failed"],
        ]
        for name, pts in systems.items()
        for p in pts
    ]


STEP_HEADERS = [
    "load",
    "batch",
    "steps",
    "step ms",
    "matmul ms",
    "attention ms",
    "rest ms (engine)",
    "TPOT mean ms",
    "rest ms (served)",
]


def decode_steps(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decode-only steps a server timed between two reads of its `step_timings` (EngineStats, --step-timing):
    per batch size, the number of steps and the mean step and its parts in ms, the busiest batch size first."""
    old = {t["batch_size"]: t for t in before}
    out = []
    for t in after:
        o = old.get(t["batch_size"], {})
        n = t["num_steps"] - o.get("num_steps", 0)
        if n <= 0:
            continue
        ms = {k: 1000 * (t[f"{k}_s"] - o.get(f"{k}_s", 0.0)) / n for k in ("step", "matmul", "attention")}
        out.append(
            {
                "batch_size": t["batch_size"],
                "num_steps": n,
                "step_ms": ms["step"],
                "matmul_ms": ms["matmul"],
                "attention_ms": ms["attention"],
                "rest_ms": ms["step"] - ms["matmul"] - ms["attention"],
            }
        )
    return sorted(out, key=lambda d: (-d["num_steps"], d["batch_size"]))


def served_rest_ms(point: dict[str, Any]) -> float:
    """At one request at a time: the client's mean TPOT less the mean matmuls and attention of a batch-1 decode step,
    i.e. everything else a token costs as served (Python, small ops, sampling, detokenization, the service's own
    work, and whatever the client's own CPU time takes from the machine); NaN where the point has no timed batch-1
    steps."""
    steps = {d["batch_size"]: d for d in point.get("decode_steps", ())}
    one = steps.get(1)
    if one is None or not math.isfinite(point["tpot_ms"]["mean"]):
        return float("nan")
    return point["tpot_ms"]["mean"] - one["matmul_ms"] - one["attention_ms"]


def step_rows(points: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per load point that timed decode steps: its busiest batch size; the served rest where it is 1."""
    rows = []
    for p in points:
        if not p.get("decode_steps"):
            continue
        d = p["decode_steps"][0]
        rest = served_rest_ms(p) if d["batch_size"] == 1 else float("nan")
        rows.append(
            [
                point_key(p),
                d["batch_size"],
                d["num_steps"],
                d["step_ms"],
                d["matmul_ms"],
                d["attention_ms"],
                d["rest_ms"],
                p["tpot_ms"]["mean"],
                rest if math.isfinite(rest) else "-",
            ]
        )
    return rows


def plot(systems: dict[str, list[dict[str, Any]]]):
    """TTFT (p50, p99) and TPOT p50 against output tok/s: one colour per system, one line style per kind of load
    (Poisson rate, closed-loop concurrency), each point labelled r<req/s> or c<in flight>."""
    fig, (ax_ttft, ax_tpot) = new_figure(ncols=2)
    for index, (name, pts) in enumerate(systems.items()):
        color = f"C{index}"
        for kind, (p50_style, p99_style) in STYLES.items():
            series = [p for p in pts if p["load"] == kind]
            if not series:
                continue
            x = [p["output_tokens_per_s"] for p in series]
            ttft = [p["ttft_ms"]["p50"] for p in series]
            ax_ttft.plot(x, ttft, p50_style, color=color, label=f"{name} {kind} p50")
            ax_ttft.plot(
                x, [p["ttft_ms"]["p99"] for p in series], p99_style, color=color, label=f"{name} {kind} p99"
            )
            ax_tpot.plot(
                x, [p["tpot_ms"]["p50"] for p in series], p50_style, color=color, label=f"{name} {kind} p50"
            )
            for p, xi, yi in zip(series, x, ttft, strict=True):
                ax_ttft.annotate(f"{kind[0]}{p['value']:g}", (xi, yi), fontsize=7)
    for ax, title in ((ax_ttft, "time to first token"), (ax_tpot, "time per output token")):
        ax.set_xlabel("output tokens / s")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"{title} vs throughput\n(r: Poisson req/s, c: requests in flight)", fontsize=9)
        ax.legend(fontsize=7)
    return fig
