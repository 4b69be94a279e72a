"""`bench multiturn --replicas N --kill-replica-at K`: kill -9 one replica's process when the first user starts its
turn K, watch /health until the replica set is whole again, and sort the run's requests by when they ran relative
to the kill (before it, in flight at it, sent after it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.replicas.load import RequestRecord
from bench.replicas.metrics import by_replica

POLL_S = 0.25
ERROR_CHARS = 200


@dataclass(frozen=True)
class HealthPoint:
    """One answer of GET /health after the kill (`t_s` seconds after it; http_status 0: no answer)."""

    t_s: float
    http_status: int
    status: str
    asked: int
    ready: int
    pids: tuple[int, ...]

    def same_state(self, other: HealthPoint) -> bool:
        return (self.http_status, self.status, self.asked, self.ready, self.pids) == (
            other.http_status,
            other.status,
            other.asked,
            other.ready,
            other.pids,
        )


def replica_pids(health: Mapping[str, Any]) -> dict[str, int]:
    """Replica name -> pid from a replica set's /health body (in its order); ValueError for a body without replicas."""
    section = health.get("replicas")
    listed = section.get("replicas") if isinstance(section, Mapping) else None
    if not listed:
        raise ValueError(f"/health lists no replicas (not a replica set, or none started): {dict(health)}")
    return {str(r["name"]): int(r["pid"]) for r in listed if r.get("pid")}


def health_point(t_s: float, http_status: int, body: Mapping[str, Any] | None) -> HealthPoint:
    """A /health answer as a point of the timeline (no body: the server did not answer)."""
    body = body or {}
    section = body.get("replicas") if isinstance(body.get("replicas"), Mapping) else {}
    pids = tuple(int(r["pid"]) for r in section.get("replicas") or () if r.get("pid"))
    return HealthPoint(
        t_s,
        http_status,
        str(body.get("status", "")),
        int(section.get("asked", 0)),
        int(section.get("ready", 0)),
        pids,
    )


def is_whole(point: HealthPoint, killed_pid: int) -> bool:
    """Every asked replica ready, the killed process no longer among them."""
    return (
        point.http_status == 200
        and point.status == "ok"
        and point.asked > 0
        and point.ready >= point.asked
        and killed_pid not in point.pids
    )


def recovery(points: Sequence[HealthPoint], killed_pid: int) -> dict[str, float | None]:
    """Seconds from the kill until /health first showed the set degraded, and until it was first whole again
    (None: not seen)."""
    degraded = next((p.t_s for p in points if not is_whole(p, killed_pid)), None)
    recovered = next((p.t_s for p in points if is_whole(p, killed_pid)), None)
    return {"degraded_s": degraded, "recovered_s": recovered}


def choose_victim(pids: Mapping[str, int], load: Mapping[str, float]) -> str:
    """The replica with the most requests running or waiting (so that there are replies to lose); ties and
    unknown load: the first listed."""
    if not pids:
        raise ValueError("no replica with a pid to kill")
    names = list(pids)
    return max(names, key=lambda name: (load.get(name, 0.0), -names.index(name)))


def replica_load(metrics_text: str) -> dict[str, float]:
    """Requests running + waiting per replica, from the engine gauges' `replica` label."""
    running = by_replica(metrics_text, "num_requests_running")
    waiting = by_replica(metrics_text, "num_requests_waiting")
    return {r: running.get(r, 0.0) + waiting.get(r, 0.0) for r in running.keys() | waiting.keys()}


def sort_requests(records: Iterable[RequestRecord], kill_s: float) -> dict[str, Any]:
    """The requests of a run by when they ran relative to the kill: ended before it, in flight at it, sent after
    it; counts and failures per group, and every failed request (times in seconds from the kill)."""
    groups: dict[str, dict[str, int]] = {
        g: {"num": 0, "num_failed": 0} for g in ("before", "in_flight", "after")
    }
    failed = []
    for r in sorted(records, key=lambda r: r.sent_s):
        group = "before" if r.done_s <= kill_s else "in_flight" if r.sent_s < kill_s else "after"
        groups[group]["num"] += 1
        if not r.ok:
            groups[group]["num_failed"] += 1
            failed.append(
                {
                    "group": group,
                    **{k: v for k, v in asdict(r).items() if k not in ("sent_s", "done_s", "error", "ok")},
                    "sent_s": r.sent_s - kill_s,
                    "done_s": r.done_s - kill_s,
                    "error": r.error[:ERROR_CHARS],
                }
            )
    return {**groups, "failed": failed}


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process `pid` is `ancestor` or one of its descendants, or in its session (Linux /proc)."""
    with contextlib.suppress(OSError):
        if os.getsid(pid) == ancestor:
            return True
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # fields after "(comm)": state, ppid, ...
    return False


class ReplicaKiller:
    """Kills one replica of the server `server_pid` once `trigger` is set (the drive's hook at turn K), after
    `delay_s` so that turn K's requests have reached the replicas; then watches /health until the set is whole."""

    def __init__(self, url: str, server_pid: int, at_turn: int, delay_s: float, timeout_s: float) -> None:
        self.url, self.server_pid, self.at_turn = url, server_pid, at_turn
        self.delay_s, self.timeout_s = delay_s, timeout_s
        self.trigger = asyncio.Event()
        self.kill_s: float | None = None

    def before_turn(self, user: int, turn: int) -> None:
        """The drive's hook: the first user to start turn `at_turn` (1-based) sets the trigger."""
        if turn + 1 == self.at_turn:
            self.trigger.set()

    async def run(self) -> dict[str, Any]:
        """Wait for the trigger, kill, watch; what happened (the timeline keeps only changes of state)."""
        await self.trigger.wait()
        await asyncio.sleep(self.delay_s)
        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as client:
            health = (await client.get("/health")).json()
            pids = replica_pids(health)
            metrics = await client.get("/metrics")
            load = replica_load(metrics.text) if metrics.status_code == 200 else {}
            victim = choose_victim(pids, load)
            pid = pids[victim]
            if not _descends_from(pid, self.server_pid):
                raise RuntimeError(
                    f"refusing to kill pid {pid} (replica {victim}): not a process of the server this benchmark "
                    f"started (pid {self.server_pid}); a failover run needs a replica set on a local Ray"
                )
            self.kill_s = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            points = await self._watch(client, pid)
        return {
            "replica": victim,
            "pid": pid,
            "at_turn": self.at_turn,
            "delay_s": self.delay_s,
            "replica_load_at_kill": load.get(victim),
            "load_at_kill": load,
            "asked": int(health["replicas"].get("asked", len(pids))),
            **recovery(points, pid),
            "health": [asdict(p) for p in points],
        }

    async def _watch(self, client: httpx.AsyncClient, killed_pid: int) -> list[HealthPoint]:
        assert self.kill_s is not None, "watch after the kill"
        points: list[HealthPoint] = []
        while True:
            now = time.perf_counter() - self.kill_s
            try:
                response = await client.get("/health")
                point = health_point(now, response.status_code, response.json())
            except (httpx.HTTPError, ValueError):
                point = health_point(now, 0, None)
            if not points or not point.same_state(points[-1]):
                points.append(point)
            if is_whole(point, killed_pid) or now > self.timeout_s:
                return points
            await asyncio.sleep(POLL_S)
