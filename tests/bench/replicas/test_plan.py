"""bench/replicas/command.py's plan: which servers an invocation starts, with which flags and engine, and the
options it refuses before starting any."""

from __future__ import annotations

import argparse

import pytest

from bench.cli import bench_main, build_parser
from bench.common import servers
from bench.replicas import command as replicas
from bench.replicas.command import RunSpec, parse_routings, plan_runs
from engine.core.config import EngineConfig


def parse(argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["multiturn", "--model", "m", *argv.split()])
    args.turns = args.turns or replicas.DEFAULT_TURNS
    return args


def test_parse_routings():
    assert parse_routings("all") == ("kv", "round-robin", "least-loaded")
    assert parse_routings("none") == ()
    assert parse_routings("round-robin, kv,kv") == ("round-robin", "kv")
    with pytest.raises(ValueError, match="--routing 'kv,random': choose from kv, round-robin, least-loaded"):
        parse_routings("kv,random")


def test_routing_all_runs_each_policy_on_the_same_replica_set():
    runs = plan_runs(parse("--replicas 2 --routing all --threads-per-replica 1"))
    assert runs == [
        RunSpec("routing/kv", "routing", 2, "kv", "local", 1),
        RunSpec("routing/round-robin", "routing", 2, "round-robin", "local", 1),
        RunSpec("routing/least-loaded", "routing", 2, "least-loaded", "local", 1),
    ]
    # the flags themselves are tests/bench/test_servers.py's
    assert runs[1].serve_args() == servers.cluster_args(2, "round-robin", 1, "local")


def test_compare_plain_and_a_failover_come_after_the_routing_runs():
    runs = plan_runs(parse("--replicas 3 --routing round-robin,kv --compare-plain --kill-replica-at 2"))
    assert [(r.name, r.replicas, r.routing, r.ray_address) for r in runs] == [
        ("routing/round-robin", 3, "round-robin", "local"),
        ("routing/kv", 3, "kv", "local"),
        ("overhead/plain", 1, "kv", ""),
        ("overhead/ray", 1, "kv", "local"),
        ("failover/round-robin", 3, "round-robin", "local"),  # the first policy listed
    ]
    assert runs[2].serve_args() == ()  # today's single process


def test_compare_plain_alone_and_a_failover_alone():
    assert [r.name for r in plan_runs(parse("--compare-plain"))] == ["overhead/plain", "overhead/ray"]
    assert [r.name for r in plan_runs(parse("--replicas 2 --routing none --kill-replica-at 3"))] == [
        "failover/kv"
    ]
    # --replicas 1 with --compare-plain: no routing run (one replica routes nothing)
    assert [r.name for r in plan_runs(parse("--replicas 1 --compare-plain"))] == [
        "overhead/plain",
        "overhead/ray",
    ]


def test_the_plain_process_gets_the_threads_in_its_engine_config_a_replica_set_by_flag():
    config = EngineConfig(model="m", num_threads=None, kv_disk_bytes=1 << 30, enable_prefix_caching=False)
    plain = RunSpec("overhead/plain", "overhead", 1, "kv", "", 2).engine_config(config)
    ray = RunSpec("overhead/ray", "overhead", 1, "kv", "local", 2).engine_config(config)
    assert (plain.num_threads, ray.num_threads) == (2, None)
    for cfg in (plain, ray):
        assert cfg.enable_prefix_caching and cfg.kv_disk_bytes == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--replicas 1", "--replicas 1 --routing 'kv' runs nothing"),
        ("--replicas 2 --routing none", "runs nothing"),
        ("--replicas 1 --kill-replica-at 2", "--kill-replica-at needs --replicas 2 or more"),
        (
            "--replicas 2 --turns 4 --kill-replica-at 5",
            "--kill-replica-at must be a turn from 1 to --turns 4, got 5",
        ),
        ("--replicas 2 --routing fastest", "--routing 'fastest'"),
        ("--replicas 2 --threads-per-replica -1", "--threads-per-replica >= 0"),
    ],
)
def test_options_that_run_nothing_or_make_no_sense_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        plan_runs(parse(argv))


def test_the_cli_refuses_before_starting_anything(tmp_path, capsys):
    with pytest.raises(SystemExit, match="bench multiturn: --kill-replica-at needs --replicas 2 or more"):
        bench_main(["multiturn", "--model", str(tmp_path), "--replicas", "1", "--kill-replica-at", "2"])
    with pytest.raises(SystemExit, match="starts its own servers"):
        bench_main(["multiturn", "--model", str(tmp_path), "--compare-plain", "--url", "http://127.0.0.1:1"])
