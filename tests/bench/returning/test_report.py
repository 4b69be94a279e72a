"""`bench multiturn --scenario returning`: its plan (sizes from the options) and its report (ratios, targets,
table) for all three runs and for a subset."""

from __future__ import annotations

import argparse
import math

import pytest

from bench.returning.command import Plan, make_plan
from bench.returning.report import make_targets, table_rows, ttft_ratios
from engine.core.config import EngineConfig

CONFIG = EngineConfig(model="unused")


def make_args(**overrides) -> argparse.Namespace:
    values = dict(
        users=16, turns=6, max_tokens=64, history_tokens=2000, pool_tokens=None, restart_after=None, concurrency=1,
        runs="in-ram,no-tier,tier",
    )  # fmt: skip
    return argparse.Namespace(**{**values, **overrides})


def test_plan_sizes_messages_pools_and_the_restart_from_the_options():
    plan = make_plan(make_args(), system_tokens=400, config=CONFIG)
    assert plan == Plan(
        num_users=16,
        num_turns=6,
        system_tokens=400,
        user_tokens=(2000 - 400 - 5 * (64 + 12)) // 6,  # 203
        max_tokens=64,
        history_tokens=2000,
        max_model_len=2576,  # 2000 x 5/4 + 64, in whole blocks of 16
        pool_tokens=16 * 2064 // 4,  # a quarter of every last prompt and answer: 8256, whole blocks
        in_ram_pool_tokens=17 * 2576,
        restart_after=3,
        concurrency=1,
        runs=("in-ram", "no-tier", "tier"),
    )


def test_plan_takes_given_sizes_rounds_pools_to_blocks_and_keeps_one_sequence_of_room():
    plan = make_plan(make_args(pool_tokens=3000, restart_after=0, runs="tier, in-ram"), 400, CONFIG)
    assert (plan.pool_tokens, plan.restart_after, plan.runs) == (3008, 0, ("in-ram", "tier"))
    small = make_plan(make_args(users=2), 400, EngineConfig(model="unused", max_model_len=3000))
    assert (small.max_model_len, small.pool_tokens) == (3000, 3008)  # a quarter (1032) would hold no sequence


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(history_tokens=800), "--history-tokens 800 leaves"),
        (dict(pool_tokens=1000), "--pool-tokens 1008 holds no max_model_len (2576)"),
        (dict(restart_after=6), "--restart-after 6 must be"),
        (dict(turns=1), "--turns >= 2"),
        (dict(runs="tier,disk"), "--runs 'tier,disk'"),
    ],
)
def test_plan_refuses_options_that_leave_no_room(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_plan(make_args(**overrides), 400, CONFIG)


def make_turn(turn: int, p50: float, after_restart: bool = False, reused_min: float = 95.0) -> dict:
    return {
        "turn": turn,
        "after_restart": after_restart,
        "num_ok": 4,
        "ttft_ms": {"p50": p50, "p99": 2 * p50},
        "share_pct": {"ram": 10.0, "disk": 80.0, "recomputed": 10.0},
        "history_reused_pct": 90.0 if turn > 1 else float("nan"),
        "history_reused_min_pct": reused_min,
        "mean_prompt_tokens": 500.0 * turn,
    }


def make_run(p50s: list[float], restart_turn: int | None = None, reused: float = 93.0) -> dict:
    turns = [make_turn(k + 1, p, k + 1 == restart_turn) for k, p in enumerate(p50s)]
    return {"turns": turns, "returning_history_reused_pct": reused}


RUNS = {
    "in-ram": make_run([400.0, 100.0, 100.0]),
    "no-tier": make_run([400.0, 600.0, 900.0]),
    "tier": make_run([400.0, 150.0, 250.0], restart_turn=2),
}


def test_ttft_ratios_per_returning_turn():
    assert ttft_ratios(RUNS) == [
        {"turn": 2, "tier_over_in_ram": 1.5, "no_tier_over_tier": 4.0},
        {"turn": 3, "tier_over_in_ram": 2.5, "no_tier_over_tier": 3.6},
    ]
    assert ttft_ratios({"tier": RUNS["tier"], "in-ram": RUNS["in-ram"]})[-1] == {
        "turn": 3,
        "tier_over_in_ram": 2.5,
    }
    nan = ttft_ratios({"tier": make_run([1.0, 2.0]), "in-ram": make_run([1.0, float("nan")])})
    assert math.isnan(nan[0]["tier_over_in_ram"])


def test_targets_compare_the_last_turn_and_the_restart_turn():
    targets = make_targets(RUNS, restart_after=1)
    assert [(t.name, t.measured, t.op, t.threshold, t.passed) for t in targets] == [
        ("tier: returning users' history tokens served from RAM or disk %", 93.0, ">=", 90.0, True),
        ("tier: turn 3 TTFT p50 / in-RAM hit's", 2.5, "<=", 2.0, False),
        ("no tier (recompute): turn 3 TTFT p50 / tier's", 3.6, ">=", 3.0, True),
        (
            "tier: turn 2, after the restart: history reused by the least conversation %",
            95.0,
            ">=",
            90.0,
            True,
        ),
    ]
    without_restart = make_targets({"tier": RUNS["tier"], "no-tier": RUNS["no-tier"]}, restart_after=0)
    assert [t.name for t in without_restart] == [
        "tier: returning users' history tokens served from RAM or disk %",
        "no tier (recompute): turn 3 TTFT p50 / tier's",
    ]
    assert make_targets({"in-ram": RUNS["in-ram"], "no-tier": RUNS["no-tier"]}, restart_after=1) == []


def test_table_has_a_row_per_run_and_turn_with_the_restart_marked():
    rows = table_rows(RUNS)
    assert [(r[0], r[1]) for r in rows] == [
        ("in-ram", "1"), ("in-ram", "2"), ("in-ram", "3"),
        ("no-tier", "1"), ("no-tier", "2"), ("no-tier", "3"),
        ("tier", "1"), ("tier", "2 (restart)"), ("tier", "3"),
    ]  # fmt: skip
    assert rows[7][2:] == [150.0, 300.0, 10.0, 80.0, 10.0, 90.0, 1000.0, 4]
