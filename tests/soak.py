"""Soak: rounds of tests/load_round.py against a server until time is up; every round must end clean and idle.

    python -m tests.soak --minutes 10              # starts its own tiny-model server on loopback
    python -m tests.soak --url http://127.0.0.1:8000 --pid 1234 --admin-token T --minutes 30

After every round: no problem reported by any client, no block in use, nothing waiting, no stream or reply left
in the service. Memory: the server's RSS after the second round may exceed the first round's by at most
--rss-bound-mib, and after the last round the second round's by the same bound (the first round warms caches up).
Prints a JSON summary; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common.servers import stop_server
from tests.faults import FAULTS_ENV
from tests.load_round import LoadConfig, faults_injected, rss_bytes, run_round, wait_idle

MIB = 1024 * 1024
DEFAULT_RSS_BOUND_MIB = 48


def server_settings(faults: bool) -> dict[str, str]:
    """The load servers' settings: up to 32 sequences at once in a 64-block pool (so it preempts), one torch thread."""
    from tests.app.factories import TINY_BLOCK_BYTES

    env = {
        "PAGEDCHAT_MAX_NUM_SEQS": "32",
        "PAGEDCHAT_KV_CACHE_BYTES": str(64 * 16 * TINY_BLOCK_BYTES),
        "PAGEDCHAT_NUM_THREADS": "1",
        "PAGEDCHAT_MAX_QUEUED_REQUESTS": "512",
        "PAGEDCHAT_NEW_IDENTITIES_PER_MINUTE": "0",  # every session job is a new browser, all from loopback
    }
    if faults:
        env[FAULTS_ENV] = "markers"
    return env


def soak(cfg: LoadConfig, pid: int | None, minutes: float, rss_bound_mib: float) -> dict[str, Any]:
    """Run rounds (at least two) for `minutes`; the summary says what each saw and whether all checks held."""
    rounds: list[dict[str, Any]] = []
    failures: list[str] = []
    deadline = time.monotonic() + minutes * 60
    while len(rounds) < 2 or time.monotonic() < deadline:
        report = asyncio.run(run_round(replace(cfg, seed=cfg.seed)))
        state = asyncio.run(wait_idle(cfg.base_url, cfg.admin_token))
        entry = report.to_json()
        entry["rss_mib"] = round(rss_bytes(pid) / MIB, 1) if pid else None
        entry["blocks_in_use_after"] = state["block_states"].count("u")
        entry["faults_injected_total"] = sum(asyncio.run(faults_injected(cfg)).values())
        entry["preemptions_total"] = state["stats"]["num_preemptions"]
        rounds.append(entry)
        print(json.dumps({"round": len(rounds), **entry}), file=sys.stderr, flush=True)
        if report.problems:
            failures.append(
                f"round {len(rounds)}: {len(report.problems)} problems, first: {report.problems[0]}"
            )
        if report.peak_streams < cfg.num_streams:
            failures.append(f"round {len(rounds)}: only {report.peak_streams} streams open at once")
    if pid:
        for a, b in ((0, 1), (1, len(rounds) - 1)):
            growth = rounds[b]["rss_mib"] - rounds[a]["rss_mib"]
            if b > a and growth > rss_bound_mib:
                failures.append(
                    f"RSS grew {growth:.1f} MiB from round {a + 1} to round {b + 1} (> {rss_bound_mib})"
                )
    return {"rounds": rounds, "rss_bound_mib": rss_bound_mib, "failures": failures, "ok": not failures}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=0.0, help="keep running rounds this long (min. 2 rounds)")
    p.add_argument("--streams", type=int, default=64, help="streams held open at once in every round")
    p.add_argument("--jobs", type=int, default=160, help="jobs per round, the held streams included")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--faults", action="store_true", help="the server injects faults; mix in faulty requests")
    p.add_argument("--url", help="an already running server (default: start one with the tiny test model)")
    p.add_argument("--pid", type=int, help="the server's pid, to watch its RSS (with --url)")
    p.add_argument("--model", help="the served model id (with --url)")
    p.add_argument("--admin-token", default="")
    p.add_argument("--rss-bound-mib", type=float, default=DEFAULT_RSS_BOUND_MIB)
    args = p.parse_args(argv)
    server = None
    if args.url:
        url, pid, model = args.url.rstrip("/"), args.pid, args.model or "default"
    else:
        from tests.app.factories import make_tiny_model_dir
        from tests.e2e.conftest import server_env, start_server

        tmp = Path(tempfile.mkdtemp(prefix="pagedchat-soak-"))
        tiny = make_tiny_model_dir()
        server = start_server(tmp, server_env(tmp, str(tiny), **server_settings(args.faults)))
        url, pid, model = server.base_url, server.process.pid, tiny.name
        print(f"server on {url} (pid {pid}), log {server.log_path}", file=sys.stderr)
    cfg = LoadConfig(
        base_url=url,
        model=model,
        num_streams=args.streams,
        num_jobs=max(args.jobs, args.streams),
        max_tokens=args.max_tokens,
        faults=args.faults,
        admin_token=args.admin_token,
    )
    try:
        summary = soak(cfg, pid, args.minutes, args.rss_bound_mib)
    finally:
        if server is not None:
            stop_server(server, timeout_s=60)
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
