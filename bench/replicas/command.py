"""`bench multiturn --replicas N`: a replica set (issue #19) under multi-turn /v1 conversations that share long
prefixes across users, once per routing policy; Ray's own overhead (`--compare-plain`); a failover run
(`--kill-replica-at K`).

Every run starts its own `pagedchat serve` (prefix caching on, the RAM pool alone, the desks' system prompts
published, one API key per user so each user is its own cache tenant), warms each system prompt once, then drives
the conversations (bench/replicas/load.py) and reads /metrics before and after: the cached share of prompt tokens
(usage.prompt_tokens_details.cached_tokens), TTFT per turn, and the router's decisions
(`pagedchat:routed_requests_total{replica,outcome}`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Coroutine
from typing import Any

import httpx

from bench.common import servers
from bench.replicas import report as replica_report
from bench.replicas.failover import ReplicaKiller
from bench.replicas.load import LoadResult, drive, warm_up
from bench.replicas.scenario import Scenario, make_scenario, server_env, write_prompt_files
from engine.core.config import EngineConfig

DEFAULT_USERS, DEFAULT_TURNS = 8, 6
BENCH_API_KEY = "pagedchat-replicas"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One server start: what kind of run, how many replicas, which routing, on which Ray, threads per engine."""

    name: str
    kind: str  # routing, overhead, failover
    replicas: int
    routing: str
    ray_address: str  # "": the plain process
    threads: int  # per engine; 0: the engine's own setting

    def serve_args(self) -> tuple[str, ...]:
        """The run's `pagedchat serve` flags (none for the plain process)."""
        return servers.cluster_args(self.replicas, self.routing, self.threads, self.ray_address)

    def engine_config(self, config: EngineConfig) -> EngineConfig:
        """The engine every replica builds: prefix caching on, no disk tier (runs share user identities, and a tier
        would bring one run's blocks back in the next); the plain process's threads set here, a replica set's by
        --threads-per-replica."""
        plain = not self.ray_address and self.replicas == 1
        threads = self.threads if plain and self.threads else config.num_threads
        return dataclasses.replace(config, enable_prefix_caching=True, kv_disk_bytes=0, num_threads=threads)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the replicas scenario (it also uses --users, --turns, --system-tokens, --max-tokens, --arrivals,
    --keep-logs)."""
    group = parser.add_argument_group(
        "--replicas (issue #19)",
        f"replica sets on Ray Serve; defaults {DEFAULT_USERS} users x {DEFAULT_TURNS} turns through /v1. Given "
        "--replicas, --compare-plain or --kill-replica-at, `bench multiturn` runs these instead of its own runs",
    )
    group.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="engine replicas of each routing run (2 or more) and of the failover run (default 2)",
    )
    group.add_argument(
        "--routing",
        default="kv",
        help=f"routing policies to run side by side: one or a comma-separated list of {', '.join(servers.ROUTINGS)}"
        "; all: every one; none: no routing runs (then --kill-replica-at routes kv)",
    )
    group.add_argument(
        "--threads-per-replica",
        type=int,
        default=1,
        help="threads of each engine (0: the engine's own setting)",
    )
    group.add_argument(
        "--ray-address",
        default="local",
        help="local: a Ray started on loopback by the server; else join ADDR",
    )
    group.add_argument(
        "--system-prompts",
        type=int,
        default=2,
        help="published system prompts (desks); user u is at desk u mod G",
    )
    group.add_argument(
        "--user-tokens",
        type=int,
        default=0,
        help="tokens of each user message (pasted notes and a question); 0: short questions and follow-ups",
    )
    group.add_argument(
        "--compare-plain",
        action="store_true",
        help="also run one replica on Ray against the plain process, same threads and load: Ray's own overhead",
    )
    group.add_argument(
        "--kill-replica-at",
        type=int,
        default=None,
        metavar="TURN",
        help="a failover run: kill -9 the busiest replica when the first user starts turn TURN",
    )
    group.add_argument(
        "--kill-delay-s",
        type=float,
        default=0.5,
        help="seconds from that turn's start to the kill (default 0.5)",
    )
    group.add_argument(
        "--recovery-timeout-s",
        type=float,
        default=300.0,
        help="how long to wait for /health to show every replica ready again after the kill",
    )


def wants_replicas(args: argparse.Namespace) -> bool:
    """Whether `bench multiturn` runs this scenario: a replicas option was given."""
    return args.replicas is not None or args.compare_plain or args.kill_replica_at is not None


def parse_routings(text: str) -> tuple[str, ...]:
    """--routing's policies in order: `all`, `none` or a comma-separated list; ValueError naming what is unknown."""
    if text.strip() == "all":
        return servers.ROUTINGS
    if text.strip() == "none":
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in servers.ROUTINGS]
    if unknown or not names:
        raise ValueError(f"--routing {text!r}: choose from {', '.join(servers.ROUTINGS)}, all or none")
    return tuple(dict.fromkeys(names))


def plan_runs(args: argparse.Namespace) -> list[RunSpec]:
    """The server starts this invocation makes, in order; ValueError for options that run nothing or make no sense."""
    routings = parse_routings(args.routing)
    replicas = args.replicas if args.replicas is not None else 2
    threads, ray = args.threads_per_replica, args.ray_address or "local"
    if replicas < 1 or threads < 0:
        raise ValueError(
            f"needs --replicas >= 1 and --threads-per-replica >= 0, got {replicas} and {threads}"
        )
    runs = []
    if args.replicas is not None and replicas >= 2:
        runs += [RunSpec(f"routing/{p}", "routing", replicas, p, ray, threads) for p in routings]
    if args.compare_plain:
        runs += [
            RunSpec("overhead/plain", "overhead", 1, "kv", "", threads),
            RunSpec("overhead/ray", "overhead", 1, "kv", ray, threads),
        ]
    if args.kill_replica_at is not None:
        if replicas < 2:
            raise ValueError(
                f"--kill-replica-at needs --replicas 2 or more (a live one to go on), got {replicas}"
            )
        if not 1 <= args.kill_replica_at <= args.turns:
            raise ValueError(
                f"--kill-replica-at must be a turn from 1 to --turns {args.turns}, got {args.kill_replica_at}"
            )
        policy = routings[0] if routings else "kv"
        runs.append(RunSpec(f"failover/{policy}", "failover", replicas, policy, ray, threads))
    if not runs:
        raise ValueError(
            f"--replicas {replicas} --routing {args.routing!r} runs nothing: routing runs need --replicas 2 or more; "
            "add --compare-plain or --kill-replica-at TURN"
        )
    return runs


async def _scrape(http: httpx.AsyncClient) -> str:
    response = await http.get("/metrics")
    if response.status_code != 200:
        raise RuntimeError(f"GET /metrics answered {response.status_code}: {response.text[:300]}")
    return response.text


async def drive_and_kill(
    load: Coroutine[Any, Any, LoadResult], killer: ReplicaKiller
) -> tuple[LoadResult, dict]:
    """The conversations and the killer side by side; whichever fails first cancels the other."""
    drive_task, kill_task = asyncio.create_task(load), asyncio.create_task(killer.run())
    try:
        done, _ = await asyncio.wait({drive_task, kill_task}, return_when=asyncio.FIRST_COMPLETED)
        if kill_task in done:
            killed = kill_task.result()  # the killer's error, if any, ends the run here
            return await drive_task, killed
        result = drive_task.result()
        if not killer.trigger.is_set():
            raise RuntimeError(f"no user started turn {killer.at_turn}: nothing was killed")
        return result, await kill_task
    finally:
        for task in (drive_task, kill_task):
            task.cancel()  # no-op for a finished task


async def measure(
    url: str,
    server_pid: int,
    spec: RunSpec,
    scenario: Scenario,
    keys: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Warm up, then the conversations between two /metrics scrapes; a failover run kills a replica meanwhile and
    afterwards, once the set is whole, sends one more turn per user (new conversations) to show it serves.

    `keys`: the warm-up's API key, then one per user; `server_pid`: the server process (a failover run kills only
    its descendants)."""
    failover = spec.kind == "failover"
    model = await warm_up(url, keys[0], scenario.system_prompts)
    server_info = {
        "replicas": spec.replicas,
        "routing": spec.routing if spec.serve_args() else "-",
        "ray_address": spec.ray_address,
        "threads": spec.threads,
    }

    def conversations(which: Scenario, label: str, staggered: bool, killer: ReplicaKiller | None = None):
        return drive(
            url,
            model,
            which,
            list(keys[1:]),
            max_tokens=args.max_tokens,
            staggered=staggered,
            label=label,
            resend_failed=failover,
            before_turn=killer.before_turn if killer else None,
        )

    staggered = args.arrivals == "staggered"
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as http:
        before = await _scrape(http)
        if not failover:
            load = await conversations(scenario, spec.name, staggered)
            return replica_report.summarise_run(
                load, scenario.num_turns, before, await _scrape(http), server_info
            )
        killer = ReplicaKiller(
            url, server_pid, args.kill_replica_at, args.kill_delay_s, args.recovery_timeout_s
        )
        load, killed = await drive_and_kill(conversations(scenario, spec.name, staggered, killer), killer)
        after = await _scrape(http)
        summary = replica_report.summarise_run(load, scenario.num_turns, before, after, server_info)
        assert killer.kill_s is not None, "the killer returned, so it killed"
        summary["failover"] = replica_report.failover_summary(
            killed, load.records, killer.kill_s, summary["num_turns_failed"]
        )
        if killed["recovered_s"] is not None:
            once = Scenario(
                scenario.system_prompts, scenario.desk_of_user, tuple(s[:1] for s in scenario.scripts)
            )
            again = await conversations(once, "after recovery", staggered=False)
            again_summary = replica_report.summarise_run(again, 1, after, await _scrape(http), server_info)
            summary["failover"]["after_recovery"] = {
                **again_summary["throughput"],
                "routed_by_replica": again_summary["routing"]["by_replica"],
            }
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every planned run, one server at a time; one JSON and PNG, the tables and the targets."""
    if args.url or args.url_no_caching or args.write_system_prompt:
        raise SystemExit("bench multiturn --replicas starts its own servers (one per run): no --url")
    args.users, args.turns = args.users or DEFAULT_USERS, args.turns or DEFAULT_TURNS
    config = args.engine_config
    from engine.loading.loader import load_tokenizer, resolve_model_path

    try:
        specs = plan_runs(args)
        scenario = make_scenario(
            load_tokenizer(
                resolve_model_path(config.model, revision=config.model_revision, gguf_file=config.gguf_file)
            ),
            num_users=args.users,
            num_turns=args.turns,
            num_desks=args.system_prompts,
            system_tokens=args.system_tokens,
            user_tokens=args.user_tokens,
            seed=args.seed,
        )
    except ValueError as exc:
        raise SystemExit(f"bench multiturn: {exc}") from None
    keys = [f"{BENCH_API_KEY}-{u}" for u in range(args.users + 1)]  # the warm-up's, then one per user
    runs: dict[str, dict[str, Any]] = {}
    failure: Exception | None = None
    with servers.log_folder(args.keep_logs) as logs:
        env = server_env(write_prompt_files(scenario.system_prompts, logs), keys)
        for spec in specs:
            slug = spec.name.replace("/", "-")
            try:
                server = servers.start_pagedchat(
                    slug, spec.engine_config(config), logs, env, spec.serve_args()
                )
                with servers.running([server]):
                    servers.wait_replicas_ready(server, spec.replicas)
                    runs[spec.name] = asyncio.run(
                        measure(server.base_url, server.process.pid, spec, scenario, keys, args)
                    )
            except Exception as exc:  # noqa: BLE001 - the runs done so far are written, then it is raised
                failure = exc
                print(
                    f"bench multiturn: run {spec.name} failed; reporting the {len(runs)} runs done",
                    file=sys.stderr,
                )
                break
    payload = replica_report.report(runs, scenario, args) if runs else {}
    if failure is not None:
        raise failure
    return payload
