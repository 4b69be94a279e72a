"""Rounds of the reliability load against a running server: many concurrent clients mixing SSE, WebSocket and
plain requests, sent by bench's load generator (bench/common/loadgen.py), each checking what it got
(tests/load_jobs.py).

One round = `num_streams` streams opened together and held open at once (a barrier: each waits, after its first
event, until all are open), then a seeded random mix of jobs: /v1 streams (the official openai client), plain /v1
requests, clients that vanish mid-stream, multi-turn sessions over SSE (some stopped, some abandoned), WebSocket chats
(some stopped, some closed mid-reply) and, when the server injects faults, requests that must fail cleanly. Every
job checks what it got; a job that does not end in `job_timeout_s` counts as a hang. Two rounds with the same seed
are identical. Run it from `tests/soak.py` (a longer mode) or `tests/reliability/test_load.py` (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common.loadgen import run_load
from tests.app.factories import service_is_idle
from tests.load_jobs import STEP_FAULT, Hold, Job, LoadConfig


@dataclass
class RoundReport:
    """What a round saw: outcomes per job kind, the peak of streams open at once, and every problem found."""

    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    peak_streams: int = 0
    num_jobs: int = 0
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""
        return {
            "jobs": self.num_jobs,
            "peak_streams": self.peak_streams,
            "duration_s": round(self.duration_s, 2),
            "outcomes": dict(sorted(self.outcomes.items())),
            "problems": self.problems[:20],
            "num_problems": len(self.problems),
        }


HELD_KINDS = ("v1_stream", "session_sse", "ws_chat")
MIXED_KINDS = ("v1_stream",) * 3 + ("v1_plain",) * 2 + ("v1_vanish", "session_sse", "session_sse", "ws_chat")
FAULT_KINDS = ("v1_fault", "ws_fault")


def plan_jobs(cfg: LoadConfig, hold: Hold) -> list[Job]:
    """The round's jobs, the same for the same seed: the held streams first, then the mix."""
    rng = random.Random(cfg.seed)
    kinds = MIXED_KINDS + (FAULT_KINDS if cfg.faults else ())
    jobs = [Job(cfg, HELD_KINDS[i % len(HELD_KINDS)], rng, hold, True) for i in range(cfg.num_streams)]
    jobs += [Job(cfg, rng.choice(kinds), rng, hold, False) for _ in range(cfg.num_jobs - cfg.num_streams)]
    # one batched step fault per round: it fails every request of its step, so more would drown the mix
    first_v1_fault = next((j for j in jobs if j.kind == "v1_fault"), None)
    if first_v1_fault is not None:
        first_v1_fault.fault_site = "step"
    return jobs


async def run_round(cfg: LoadConfig) -> RoundReport:
    """Run one round against the server and return what it saw (problems included, never raised)."""
    report, started = RoundReport(), time.monotonic()
    hold = Hold(cfg.num_streams)
    jobs = plan_jobs(cfg, hold)
    held, mixed = jobs[: cfg.num_streams], jobs[cfg.num_streams :]

    async def guarded(job: Job) -> None:
        try:
            report.outcomes[await asyncio.wait_for(job.run(), cfg.job_timeout_s)] += 1
        except asyncio.TimeoutError:
            report.problems.append(f"{job.kind}: no end within {cfg.job_timeout_s} s (a hang)")
        except Exception as exc:  # noqa: BLE001 - every problem is reported, none stops the round
            if cfg.faults and STEP_FAULT in str(
                exc
            ):  # it shared a step with a faulty request: failed cleanly
                report.outcomes[f"{job.kind} failed by a step fault in its batch"] += 1
            else:
                where = f" (after {job.trace[-1]})" if job.trace else ""
                report.problems.append(f"{job.kind}{where}: {type(exc).__name__}: {str(exc)[:300]}")

    async def mix_after_all_open() -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(hold.all_open.wait(), timeout=90)
        await run_load(lambda i, _: guarded(mixed[i]), len(mixed), concurrency=cfg.concurrency)

    # the held streams all at once, the mix `concurrency` at a time once they are open
    hold_all = run_load(lambda i, _: guarded(held[i]), len(held), concurrency=max(1, len(held)))
    await asyncio.gather(hold_all, mix_after_all_open())
    report.num_jobs, report.peak_streams = len(jobs), hold.peak
    report.duration_s = time.monotonic() - started
    return report


async def wait_idle(base_url: str, admin_token: str = "", timeout_s: float = 30.0) -> dict[str, Any]:
    """The admin state once no block is in use, nothing waits and the service holds no stream or reply."""
    headers = {"X-Admin-Token": admin_token} if admin_token else {}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http:
        while True:
            state = (await http.get("/api/admin/state")).json()
            if service_is_idle(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"not idle after {timeout_s} s: {state['stats']} {state['service']}")
            await asyncio.sleep(0.1)


async def faults_injected(cfg: LoadConfig) -> dict[str, int]:
    """The faults a tests/fault_server.py server injected so far, per site ({} when the load brings none)."""
    if not cfg.faults:
        return {}
    async with httpx.AsyncClient(base_url=cfg.base_url, timeout=30) as http:
        response = await http.get("/test/faults")
        response.raise_for_status()
        return response.json()


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
