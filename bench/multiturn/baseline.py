"""`bench multiturn --baseline-url`: the same conversations through /v1 against pagedchat and any other
OpenAI-compatible server (llama.cpp's `llama-server`), in one run.

Both servers get the very same users (same scripts, same system prompt, history resent as text each turn, greedy, one
TCP connection per request) and the report compares what a team would feel: the wall time of the whole load, the
output rate, and time to first token per turn. pagedchat is started here with prefix caching on and the system prompt
published (so users share it, each user's own turns stay its own), unless `--url` names a running one; the baseline
runs however it was started (llama.cpp reuses a prefix per slot: the longest common prefix with what that slot held).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from bench.common import servers
from bench.common.report import new_figure, print_report, write_results
from bench.multiturn.runs import SYSTEM_PROMPT_FILE, run_mode, workload_fields


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """How many times better pagedchat did: wall time and per-turn TTFT p50 as baseline ÷ pagedchat (higher is
    better for pagedchat), output rate as pagedchat ÷ baseline."""
    return {
        "wall_time": theirs["wall_s"] / ours["wall_s"],
        "output_tokens_per_s": rate(ours) / rate(theirs) if rate(theirs) else float("nan"),
        "ttft_p50_per_turn": [
            t["ttft_ms"]["p50"] / o["ttft_ms"]["p50"]
            for o, t in zip(ours["turns"], theirs["turns"], strict=True)
        ],
    }


def rate(run: dict[str, Any]) -> float:
    """Output tokens per second of wall time over the measured turns."""
    return run["completion_tokens"] / run["wall_s"]


def run(args: argparse.Namespace, system: str, bench_keys: tuple[str, ...]) -> dict[str, Any]:
    """pagedchat (started here with `bench_keys`, one per user and the warm-up's, unless --url), then the baseline;
    print, write JSON + PNG."""
    config = args.engine_config
    entry = servers.served_model(args.baseline_url)  # fail before the long pagedchat run when it is not up
    name = args.baseline_name or servers.baseline_name(entry)
    if name == "pagedchat":
        raise SystemExit("bench multiturn: --baseline-name must differ from pagedchat")
    url_keys = tuple(k.strip() for k in (args.api_key or "").split(",") if k.strip())
    systems: dict[str, dict[str, Any]] = {}
    with servers.log_folder(args.keep_logs) as logs:
        if args.url is not None:
            systems["pagedchat"] = asyncio.run(
                run_mode(args.url, "v1", url_keys, system, args, "pagedchat /v1", 0, keep_alive=False)
            )
        else:
            prompt_file = logs / SYSTEM_PROMPT_FILE
            prompt_file.write_text(system, encoding="utf-8")
            cfg = dataclasses.replace(config, enable_prefix_caching=True, kv_disk_bytes=0)
            server_env = {
                "PAGEDCHAT_API_KEYS": ",".join(bench_keys),
                "PAGEDCHAT_SHARED_PROMPT_FILES": str(prompt_file),
            }
            server = servers.start_pagedchat("pagedchat", cfg, logs, server_env)
            with servers.running([server]):
                systems["pagedchat"] = asyncio.run(
                    run_mode(
                        server.base_url, "v1", bench_keys, system, args, "pagedchat /v1", 0, keep_alive=False
                    )
                )
        systems[name] = asyncio.run(
            run_mode(args.baseline_url, "v1", (), system, args, f"{name} /v1", 0, keep_alive=False)
        )
    payload = {
        "model": config.model,
        "workload": {
            "label": "synthetic: templated support-chat conversations through /v1 (history resent as text)",
            **workload_fields(args, system),
            "keep_alive": False,
            "same_scripts": "both servers get the same users' messages (seed 0)",
        },
        "baseline": {"name": name, "url": args.baseline_url, "model": entry.get("id")},
        "systems": systems,
        "ratios_meaning": "wall_time and ttft_p50_per_turn: baseline / pagedchat; output_tokens_per_s: pagedchat / "
        "baseline (above 1: pagedchat better)",
        "ratios": ratios(systems["pagedchat"], systems[name]),
        "targets": [],
    }
    paths = write_results("multiturn-baseline", payload, _plot(systems), args.results_dir, args.command_line)
    headers = [
        "server",
        "wall s",
        "out tok/s",
        "turn 1 TTFT p50 ms",
        f"turn {args.turns} TTFT p50 ms",
        "cached %",
    ]
    rows = [
        [
            n,
            r["wall_s"],
            rate(r),
            r["turns"][0]["ttft_ms"]["p50"],
            r["turns"][-1]["ttft_ms"]["p50"],
            r["cache_hit_pct"],
        ]
        for n, r in systems.items()
    ]
    title = (
        f"multiturn against {name}: {args.users} users x {args.turns} turns, {args.system_tokens}-token system "
        f"prompt ({name} ÷ pagedchat wall time: {payload['ratios']['wall_time']:.2f}x)"
    )
    print_report(title, headers, rows, (), paths)
    return payload


def _plot(systems: dict[str, dict[str, Any]]):
    fig, (ax_ttft, ax_wall) = new_figure(ncols=2)
    for name, r in systems.items():
        x = [t["turn"] for t in r["turns"]]
        ax_ttft.plot(x, [t["ttft_ms"]["p50"] for t in r["turns"]], "o-", label=name)
    ax_ttft.set_title("time to first token (p50 over users)")
    ax_ttft.set_xlabel("turn")
    ax_ttft.set_ylabel("ms")
    ax_ttft.set_yscale("log")
    ax_ttft.legend(fontsize=8)
    names = list(systems)
    ax_wall.bar(names, [systems[n]["wall_s"] for n in names])
    ax_wall.set_title("wall time of the whole load")
    ax_wall.set_ylabel("s")
    return fig
