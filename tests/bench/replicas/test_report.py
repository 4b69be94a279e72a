"""bench/replicas/report.py: a run's summary from its turns, requests and /metrics text, Ray's
overhead, the failover's account, the targets, the tables, and the JSON + PNG written."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from bench.common.session_client import TurnResult
from bench.replicas import report as replica_report
from bench.replicas.load import LoadResult, RequestRecord
from bench.replicas.scenario import Scenario
from engine.core.config import EngineConfig


def exposition(routed: dict[tuple[str, str], int], hits: dict[str, int], queries: dict[str, int]) -> str:
    lines = ["# TYPE pagedchat:routed_requests counter"]
    lines += [
        f'pagedchat:routed_requests_total{{replica="{r}",outcome="{o}"}} {n}' for (r, o), n in routed.items()
    ]
    for name, values in (("prefix_cache_hits", hits), ("prefix_cache_queries", queries)):
        lines.append(f"# TYPE pagedchat:{name} counter")
        lines += [f'pagedchat:{name}_total{{model_name="m",replica="{r}"}} {n}' for r, n in values.items()]
    return "\n".join(lines) + "\n"


def turn(ttft_s: float, prompt: int, cached: int, ok: bool = True) -> TurnResult:
    return TurnResult(ok=ok, ttft_s=ttft_s, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=8)


def make_run(ttft_scale: float = 1.0, tokens_per_record: int = 8, routing: str = "kv") -> dict:
    """Two users x two turns, four requests over 2 s; r1 restarted between the scrapes (its counters went down)."""
    per_user = [
        [turn(0.1 * ttft_scale, 100, 50), turn(0.2 * ttft_scale, 200, 180)],
        [turn(0.3 * ttft_scale, 100, 60), turn(0.4 * ttft_scale, 200, 190)],
    ]
    records = [
        RequestRecord(u, 0, k, 1, 10.0 + k, 11.0 + k, True, tokens_per_record) for u in (0, 1) for k in (0, 1)
    ]
    before = exposition({("r0", "longest_prefix"): 5}, {"r0": 100, "r1": 500}, {"r0": 200, "r1": 1000})
    after = exposition(
        {("r0", "longest_prefix"): 8, ("r1", "longest_prefix"): 1, ("r1", "load_fallback"): 1},
        {"r0": 160, "r1": 30},
        {"r0": 300, "r1": 40},
    )
    server = {"replicas": 2, "routing": routing, "ray_address": "local", "threads": 1}
    return replica_report.summarise_run(LoadResult(per_user, records), 2, before, after, server)


def test_a_runs_summary():
    run = make_run()
    assert run["cache_hit_pct"] == pytest.approx(100 * 480 / 600)
    assert [t["cache_hit_pct"] for t in run["turns"]] == pytest.approx([55.0, 92.5])
    assert run["ttft_ms_all"]["p50"] == pytest.approx(250.0)
    assert run["throughput"]["output_tokens_per_s"] == pytest.approx(32 / 2.0)
    assert run["routing"]["by_outcome"]["longest_prefix"] == 4 and run["routing"]["num_routed"] == 5
    assert run["routing"]["longest_prefix_pct"] == pytest.approx(80.0)
    # r0 counted on; r1 restarted, so its counters started over: all it counts now is since the restart
    assert run["replica_prefix_hit_pct"] == pytest.approx({"r0": 60.0, "r1": 75.0})


def test_ray_overhead_ratios():
    plain, ray = make_run(), make_run(ttft_scale=1.05, tokens_per_record=6)
    ratios = replica_report.overhead(plain, ray)
    assert ratios["ttft_p50_ratio"] == pytest.approx(1.05)
    assert ratios["ttft_p99_ratio"] == pytest.approx(1.05)
    assert ratios["throughput_ratio"] == pytest.approx(8 / 6)


def make_failover(recovered_s: float | None) -> dict:
    records = [
        RequestRecord(0, 0, 1, 1, 98.0, 101.0, False, 0, "APIError: replica died"),
        RequestRecord(0, 0, 1, 2, 101.0, 103.0, True, 8),
        RequestRecord(1, 0, 1, 1, 99.0, 100.5, True, 8),
    ]
    killed = {
        "replica": "r1",
        "pid": 4242,
        "at_turn": 2,
        "delay_s": 0.5,
        "replica_load_at_kill": 1.0,
        "load_at_kill": {"r0": 1.0, "r1": 1.0},
        "asked": 2,
        "degraded_s": 0.25,
        "recovered_s": recovered_s,
        "health": [],
    }
    return replica_report.failover_summary(killed, records, 100.0, num_turns_failed=0)


def test_targets_of_everything_an_invocation_measured():
    runs = {"routing/kv": make_run(), "routing/round-robin": make_run(routing="round-robin")}
    ratios = replica_report.overhead(make_run(), make_run(ttft_scale=1.2))
    targets = replica_report.make_targets(runs, ratios, make_failover(12.0), recovery_timeout_s=300.0)
    assert [(t.name, t.measured, t.passed) for t in targets] == [
        ("kv routing: prompt tokens from the cache %", pytest.approx(80.0), False),
        ("Ray, 1 replica: TTFT p50 / the plain process's", pytest.approx(1.2), False),
        ("the plain process's output tokens/s / Ray's (1 replica)", pytest.approx(1.0), True),
        ("failover: failed requests that were not in flight at the kill", 0, True),
        ("failover: measured turns failed after one resend", 0, True),
        ("failover: seconds until /health showed every replica ready again", 12.0, True),
    ]
    never = replica_report.make_targets({}, None, make_failover(None), recovery_timeout_s=300.0)
    assert math.isnan(never[-1].measured) and not never[-1].passed


def test_tables_and_failover_lines():
    runs = {"routing/kv": make_run(), "routing/round-robin": make_run(routing="round-robin")}
    rows = replica_report.table_rows(runs)
    assert len(rows[0]) == len(replica_report.HEADERS)
    assert rows[0][:6] == ["routing/kv", 2, "kv", pytest.approx(80.0), pytest.approx(80.0), 1]
    headers, per_turn = replica_report.per_turn_table(runs)
    assert headers == [
        "turn",
        "routing/kv p50",
        "p99",
        "cached %",
        "routing/round-robin p50",
        "p99",
        "cached %",
    ]
    assert [row[0] for row in per_turn] == [1, 2] and per_turn[1][3] == pytest.approx(92.5)
    lines = replica_report.failover_lines(make_failover(12.0))
    assert lines[0].startswith("killed replica r1 (pid 4242) when the first user started turn 2 (+0.50 s)")
    assert "in flight at it: 2 (1 failed); sent after it: 1 (0 failed)" in lines[1]
    assert lines[2] == "recovery: /health degraded after 0.25 s, whole again after 12.0 s"
    assert lines[4].startswith("  failed (in_flight): user 0 conversation 0 turn 2 attempt 1, sent -2.00 s")


def test_report_writes_one_json_and_png_with_every_run(tmp_path, capsys):
    runs = {
        "routing/kv": make_run(),
        "overhead/plain": make_run(),
        "overhead/ray": make_run(ttft_scale=1.05),
        "failover/kv": {**make_run(), "failover": make_failover(12.0)},
    }
    scenario = Scenario(("a", "bb"), (0, 1), (("x", "y"), ("z", "w")))
    args = argparse.Namespace(
        engine_config=EngineConfig(model="tiny"),
        system_tokens=400,
        user_tokens=0,
        max_tokens=64,
        arrivals="staggered",
        replicas=2,
        threads_per_replica=1,
        ray_address="local",
        recovery_timeout_s=300.0,
        results_dir=str(tmp_path),
        command_line="pagedchat bench multiturn --replicas 2",
    )
    payload = replica_report.report(runs, scenario, args)
    (json_path,) = tmp_path.glob("multiturn-replicas-*.json")
    (png_path,) = tmp_path.glob("multiturn-replicas-*.png")
    assert png_path.read_bytes()[:4] == b"\x89PNG"
    doc = json.loads(json_path.read_text())
    assert list(doc["runs"]) == list(runs)
    assert doc["workload"]["system_prompt_chars"] == [1, 2]
    assert doc["ray_overhead"]["ttft_p50_ratio"] == pytest.approx(1.05)
    assert doc["failover"]["replica"] == "r1"
    assert [t["name"] for t in doc["targets"]] == [t["name"] for t in payload["targets"]]
    assert len(doc["targets"]) == 6
    out = capsys.readouterr().out
    assert "== multiturn, replicas: 2 users x 2 turns through /v1: per turn ==" in out
    assert "Ray overhead (1 replica vs the plain process): ttft_p50_ratio 1.050" in out
    assert "killed replica r1 (pid 4242)" in out
