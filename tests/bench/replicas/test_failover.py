"""bench/replicas/failover.py: reading /health, choosing and killing a replica, watching the set recover,
sorting requests around the kill. The replica set here is a fake on loopback whose replicas are `sleep`
processes of this test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench.replicas.command import drive_and_kill
from bench.replicas.failover import (
    HealthPoint,
    ReplicaKiller,
    choose_victim,
    health_point,
    is_whole,
    recovery,
    replica_pids,
    sort_requests,
)
from bench.replicas.load import RequestRecord


def health_body(status: str, ready: int, replicas: list[tuple[str, int, str]]) -> dict[str, Any]:
    entries = [{"name": n, "pid": p, "state": s} for n, p, s in replicas]
    return {"status": status, "replicas": {"asked": len(replicas), "ready": ready, "replicas": entries}}


def test_replica_pids_in_the_order_health_lists_them():
    body = health_body("ok", 2, [("r1", 11, "RUNNING"), ("r0", 10, "RUNNING")])
    assert list(replica_pids(body).items()) == [("r1", 11), ("r0", 10)]
    with pytest.raises(ValueError, match="/health lists no replicas"):
        replica_pids({"status": "ok", "model": "tiny"})  # a plain process


def test_recovery_is_the_first_whole_answer_without_the_killed_process():
    killed = 11
    points = [
        health_point(
            0.1, 200, health_body("ok", 2, [("r0", 10, "RUNNING"), ("r1", 11, "RUNNING")])
        ),  # not seen
        health_point(0.6, 200, health_body("degraded", 1, [("r0", 10, "RUNNING"), ("r1", 11, "DEAD")])),
        health_point(1.0, 0, None),  # no answer
        health_point(4.0, 200, health_body("ok", 2, [("r0", 10, "RUNNING"), ("r1", 12, "RUNNING")])),
    ]
    assert points[1] == HealthPoint(0.6, 200, "degraded", 2, 1, (10, 11))
    assert points[2] == HealthPoint(1.0, 0, "", 0, 0, ())
    assert [is_whole(p, killed) for p in points] == [False, False, False, True]
    assert recovery(points, killed) == {"degraded_s": 0.1, "recovered_s": 4.0}
    assert recovery(points[:3], killed) == {"degraded_s": 0.1, "recovered_s": None}


def test_the_victim_is_the_busiest_replica_ties_and_unknown_load_the_first_listed():
    pids = {"r1": 11, "r0": 10, "r2": 12}
    assert choose_victim(pids, {"r0": 3.0, "r1": 1.0}) == "r0"
    assert choose_victim(pids, {"r0": 2.0, "r2": 2.0}) == "r0"
    assert choose_victim(pids, {}) == "r1"


def record(sent: float, done: float, ok: bool, user: int = 0, error: str = "") -> RequestRecord:
    return RequestRecord(user, 0, 1, 1, sent, done, ok, 4 if ok else 0, error)


def test_requests_are_sorted_around_the_kill():
    records = [
        record(103.0, 104.0, False, user=3, error="APIError: replica gone " + "x" * 300),
        record(90.0, 95.0, True),
        record(98.0, 101.0, False, user=1, error="APIError: replica died"),
        record(99.0, 100.5, True),
        record(102.0, 106.0, True, user=2),
    ]
    sorted_ = sort_requests(records, kill_s=100.0)
    assert {g: sorted_[g] for g in ("before", "in_flight", "after")} == {
        "before": {"num": 1, "num_failed": 0},
        "in_flight": {"num": 2, "num_failed": 1},
        "after": {"num": 2, "num_failed": 1},
    }
    first, second = sorted_["failed"]
    assert first == {
        "group": "in_flight",
        "user": 1,
        "conversation": 0,
        "turn": 1,
        "attempt": 1,
        "completion_tokens": 0,
        "sent_s": -2.0,
        "done_s": 1.0,
        "error": "APIError: replica died",
    }
    assert second["group"] == "after" and second["user"] == 3 and len(second["error"]) == 200


class FakeReplicaSet:
    """/health and /metrics of a replica set whose replicas are `sleep` processes: a replica found dead is shown
    dead (degraded) in one /health answer, and in the next a fresh process has taken its place."""

    def __init__(self, loads: dict[str, int], pids: dict[str, int] | None = None) -> None:
        self.loads = loads
        self.fixed_pids = pids or {}  # replicas listed with a pid that is not a child of the fake
        self.children = {name: self._spawn() for name in loads if name not in self.fixed_pids}
        self.killed: dict[str, subprocess.Popen] = {}  # replaced replicas, for their exit codes
        self.lock = threading.Lock()

    @staticmethod
    def _spawn() -> subprocess.Popen:
        return subprocess.Popen(["sleep", "60"])

    def health(self) -> dict[str, Any]:
        with self.lock:
            entries = []
            for name in self.loads:
                if name in self.fixed_pids:
                    entries.append((name, self.fixed_pids[name], "RUNNING"))
                    continue
                child = self.children[name]
                if child.poll() is None:
                    entries.append((name, child.pid, "RUNNING"))
                elif name in self.killed:  # shown dead once already: restarted
                    self.children[name] = self._spawn()
                    entries.append((name, self.children[name].pid, "RUNNING"))
                else:
                    self.killed[name] = child
                    entries.append((name, child.pid, "DEAD"))
            ready = sum(state == "RUNNING" for _, _, state in entries)
            return health_body("ok" if ready == len(entries) else "degraded", ready, entries)

    def metrics(self) -> str:
        lines = ["# TYPE pagedchat:num_requests_running gauge"]
        lines += [f'pagedchat:num_requests_running{{replica="{n}"}} {v}' for n, v in self.loads.items()]
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        for child in [*self.children.values(), *self.killed.values()]:
            child.kill()
            child.wait()


@contextlib.contextmanager
def serve(fake: FakeReplicaSet) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                body, kind = json.dumps(fake.health()).encode(), "application/json"
            else:
                body, kind = fake.metrics().encode(), "text/plain"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        fake.stop()


def test_the_killer_kills_the_busiest_replica_at_turn_k_and_watches_the_set_recover():
    fake = FakeReplicaSet({"r0": 1, "r1": 3})
    r0, r1 = fake.children["r0"], fake.children["r1"]
    with serve(fake) as url:
        killer = ReplicaKiller(url, os.getpid(), at_turn=2, delay_s=0.0, timeout_s=60.0)
        killer.before_turn(user=0, turn=0)
        assert not killer.trigger.is_set()
        killer.before_turn(user=3, turn=1)  # the first user to start turn 2
        assert killer.trigger.is_set()
        killed = asyncio.run(killer.run())
        assert r1.returncode == -signal.SIGKILL and r0.poll() is None
        assert (killed["replica"], killed["pid"], killed["at_turn"]) == ("r1", r1.pid, 2)
        assert killed["load_at_kill"] == {"r0": 1.0, "r1": 3.0} and killed["replica_load_at_kill"] == 3.0
        assert killed["asked"] == 2
        timeline = killed["health"]
        assert any(p["ready"] == 1 and p["status"] == "degraded" for p in timeline)
        assert (
            timeline[-1]["ready"] == 2
            and timeline[-1]["status"] == "ok"
            and r1.pid not in timeline[-1]["pids"]
        )
        assert killed["degraded_s"] is not None and killed["recovered_s"] >= killed["degraded_s"]


def test_the_killer_refuses_a_process_that_is_not_the_servers():
    # a process of another session that is no descendant of this test: the shell that started it has exited
    shell = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    stranger = int(shell.stdout)
    try:
        with serve(FakeReplicaSet({"r0": 5, "r1": 0}, pids={"r0": stranger})) as url:
            killer = ReplicaKiller(url, os.getpid(), at_turn=1, delay_s=0.0, timeout_s=5.0)
            killer.trigger.set()
            with pytest.raises(RuntimeError, match=f"refusing to kill pid {stranger} \\(replica r0\\)"):
                asyncio.run(killer.run())
        os.kill(stranger, 0)  # still alive
    finally:
        os.kill(stranger, signal.SIGKILL)


def test_a_failing_killer_cancels_the_conversations_and_a_kill_that_never_came_is_an_error():
    cancelled: list[bool] = []

    async def conversations_forever():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def conversations_done():
        return "load"

    with serve(FakeReplicaSet({})) as url:  # /health lists no replicas
        killer = ReplicaKiller(url, os.getpid(), at_turn=1, delay_s=0.0, timeout_s=5.0)
        killer.trigger.set()
        with pytest.raises(ValueError, match="/health lists no replicas"):
            asyncio.run(drive_and_kill(conversations_forever(), killer))
        assert cancelled == [True]
        never = ReplicaKiller(url, os.getpid(), at_turn=3, delay_s=0.0, timeout_s=5.0)
        with pytest.raises(RuntimeError, match="no user started turn 3: nothing was killed"):
            asyncio.run(drive_and_kill(conversations_done(), never))
