"""`bench multiturn --scenario returning` against one server: the users' sessions, their turns in rounds, the tier's
files made cold before each round, and the restart."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import loadgen, servers
from bench.common import session_client as sc
from bench.common.conversations import user_clients
from bench.common.report import progress
from bench.returning.stats import HitCounters, read_hit_counters, read_metrics, summarise_run, summarise_turn
from bench.returning.tier_files import drop_from_page_cache, wait_until_settled


@dataclasses.dataclass(frozen=True)
class Script:
    """What every run sends: the system prompt, each user's messages, the API keys (the first is the warm-up's)."""

    system: str
    messages: list[list[str]]  # [user][turn]
    keys: tuple[str, ...]  # 1 + number of users
    max_tokens: int

    @property
    def num_turns(self) -> int:
        return len(self.messages[0])


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """How one run plays the script: its label, users at once, and (tier run) the tier directory and restart."""

    label: str
    concurrency: int
    tier_dir: Path | None = None
    restart_after: int = 0  # turn after which the server restarts; 0: never (only with a tier_dir)


async def warm_up(url: str, key: str, system: str) -> None:
    """One short turn under the warm-up's own identity, so the first measured turn is not the process's first."""
    async with user_clients(url, [key]) as [(http, _)]:
        session_id = await sc.create_session(http, {"max_tokens": 8}, system_prompt=system, title="warm-up")
        result = await sc.send_message(http, session_id, "Hello!")
    if not result.ok:
        raise RuntimeError(f"warm-up turn on {url} failed: {result.error}")


async def open_sessions(url: str, script: Script) -> list[str]:
    """One session per user, under that user's key."""
    settings = {"temperature": 0.0, "max_tokens": script.max_tokens}
    async with user_clients(url, list(script.keys[1:])) as clients:
        return [
            await sc.create_session(http, settings, system_prompt=script.system, title="returning")
            for http, _ in clients
        ]


async def play_round(
    url: str,
    keys: Sequence[str],
    session_ids: list[str],
    messages: list[str],
    concurrency: int,
    tick: Callable[[], None],
) -> tuple[list[sc.TurnResult], HitCounters | None]:
    """Every user's next turn, in user order, `concurrency` at a time; and the server's counters over the round."""
    gate = asyncio.Semaphore(concurrency)  # first come, first served: users start in order
    async with httpx.AsyncClient(base_url=url, timeout=loadgen.CLIENT_TIMEOUT_S) as admin:
        before = await read_hit_counters(admin)
        async with user_clients(url, list(keys)) as clients:

            async def turn(u: int) -> sc.TurnResult:
                async with gate:
                    result = await sc.send_message(clients[u][0], session_ids[u], messages[u])
                tick()
                return result

            results = await asyncio.gather(*(turn(u) for u in range(len(session_ids))))
        after = await read_hit_counters(admin)
    return list(results), after.minus(before) if before and after else None


def play(started: list[servers.ServerProcess], script: Script, spec: RunSpec) -> dict[str, Any]:
    """Every round on `started[0]`, summarised. A restart replaces the server in `started`, so that whoever stops
    the servers of that list stops the one running."""
    url = started[0].base_url  # a restarted server listens on the same port
    asyncio.run(warm_up(url, script.keys[0], script.system))
    session_ids = asyncio.run(open_sessions(url, script))
    rounds: list[list[sc.TurnResult]] = []
    per_turn: list[dict[str, Any]] = []
    with progress(len(session_ids) * script.num_turns, spec.label, unit="turn") as bar:
        for k in range(script.num_turns):
            restart = spec.tier_dir is not None and k == spec.restart_after > 0
            if restart:
                started[0] = servers.restart_pagedchat(started[0])
                asyncio.run(warm_up(url, script.keys[0], script.system))
            cold = None
            if spec.tier_dir is not None:
                wait_until_settled(spec.tier_dir)
                cold = drop_from_page_cache(spec.tier_dir)
            messages = [m[k] for m in script.messages]
            results, delta = asyncio.run(
                play_round(
                    url, script.keys[1:], session_ids, messages, spec.concurrency, lambda: bar.update(1)
                )
            )
            turn = summarise_turn(k + 1, results, rounds[-1] if rounds else None, delta, restart)
            if cold is not None:
                turn["cold_tier_files"] = dataclasses.asdict(cold)
            per_turn.append(turn)
            rounds.append(results)
    summary = summarise_run(per_turn, rounds)
    if spec.tier_dir is not None:
        summary["tier_dir"] = str(spec.tier_dir)
        summary["restart_turn"] = spec.restart_after + 1 if spec.restart_after else None
        summary["tier_stats"] = asyncio.run(_tier_stats(url))
    return summary


async def _tier_stats(url: str) -> dict[str, Any] | None:
    """The tier's own counters (writes, drops, loads, evictions), where the admin API gives them."""
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        stats = await sc.admin_stats(client)
    tier = (stats or {}).get("tier")
    return tier if isinstance(tier, dict) else None


def pool_of(url: str) -> tuple[int, int]:
    """(bytes of KV per token, tokens the pool holds) from the server's metrics."""

    async def fetch() -> dict[str, float] | None:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            return await read_metrics(client)

    metrics = asyncio.run(fetch()) or {}
    per_token = metrics.get("pagedchat:kv_cache_bytes_per_token")
    capacity = metrics.get("pagedchat:kv_cache_capacity_tokens")
    if not per_token or capacity is None:
        raise RuntimeError(f"{url}/metrics gives no kv_cache_bytes_per_token and kv_cache_capacity_tokens")
    return math.ceil(per_token), int(capacity)
