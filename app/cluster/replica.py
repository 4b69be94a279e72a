"""One engine replica of the Serve deployment: an `LLMEngine` on its own thread, streaming to the ingress.

The class is plain (no decorator): `ray_runtime` turns it into the `EngineReplica` deployment with the replica
count, threads and request router the settings ask for. Each replica runs the same `AsyncEngine` bridge as the
single-process server; what it adds is the wire form (`app.cluster.wire`), its routing digest, and a disk tier of
its own (a subdirectory per replica rank: one tier per directory, and a restarted replica finds its files again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from app.cluster.digest import ReplicaDigest
from app.cluster.loopback import bind_serve_grpc_to_loopback
from app.cluster.wire import DELTA_INTERVAL_S, Accepted, Failed, Rejected, slim
from app.engine_client.async_engine import AsyncEngine, engine_factory
from app.engine_client.protocol import EngineInfo, EngineOverloaded, EngineUnavailable
from app.engine_client.request_stream import RequestTimedOut
from engine.core.config import EngineConfig
from engine.core.sequence import SamplingParams
from engine.core.stats import EngineStats

logger = logging.getLogger(__name__)
STATS_PERIOD_S = 0.25  # how stale the routing stats may be, plus Serve's own pull period


@dataclasses.dataclass(frozen=True)
class ReplicaOptions:
    """The service limits each replica's bridge applies (from the settings)."""

    max_queued_requests: int = 256
    request_timeout_s: float = 600.0
    drain_s: float = 10.0
    generation: str = "1"  # bumped by a rolling restart


def replica_config(config: EngineConfig, rank: int) -> EngineConfig:
    """The engine config of replica `rank`: its disk tier in a directory of its own."""
    if not config.kv_disk_dir:
        return config
    return dataclasses.replace(config, kv_disk_dir=str(Path(config.kv_disk_dir) / f"replica-{rank}"))


class EngineReplica:
    """An engine replica. Serve calls `generate` (streaming), `call`, `info` and `record_routing_stats`."""

    async def __init__(self, config: EngineConfig, options: ReplicaOptions) -> None:
        bind_serve_grpc_to_loopback()  # before Serve starts this replica's gRPC server, which follows __init__
        from ray import serve

        self._refresher: asyncio.Task | None = None
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self.rank = context.rank.rank if context.rank is not None else 0
        self.pid = os.getpid()
        config = replica_config(config, self.rank)
        self.bridge = AsyncEngine(
            engine_factory(config),
            max_queued_requests=options.max_queued_requests,
            request_timeout_s=options.request_timeout_s,
            drain_s=options.drain_s,
        )
        await self.bridge.start()
        self.started_at = time.time()
        self.stats: EngineStats | None = None
        self.stats_at = 0.0
        self.digest = ReplicaDigest.unknown(self.name)
        await self._refresh()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="replica-stats")
        logger.info("replica %s (rank %d, pid %d) serves", self.name, self.rank, self.pid)

    async def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        public_prefix_len: int = 0,
        route: Any = None,  # read by the request router in the ingress, not here
    ) -> AsyncIterator[Any]:
        """Accepted (or Rejected), then the request's outputs, slimmed and merged to one per DELTA_INTERVAL_S;
        cancelling the call (the client went) aborts the request."""
        del route
        try:
            stream = await self.bridge.add_request(
                request_id, prompt, params, cache_salt=cache_salt, public_prefix_len=public_prefix_len
            )
        except (ValueError, EngineOverloaded, EngineUnavailable) as exc:
            yield Rejected.from_error(exc)
            return
        yield Accepted(self.name)
        async with stream:
            try:
                async for output in stream:
                    yield slim(output)
                    if output.finished:
                        return
                    # meanwhile the stream merges what the engine makes into one pending output
                    await asyncio.sleep(DELTA_INTERVAL_S)
            except RequestTimedOut as exc:
                yield Failed(str(exc), timed_out=True)
            except Exception as exc:  # noqa: BLE001 - RequestFailed and the like: the ingress fails the stream
                yield Failed(str(exc))

    async def call(self, fn: Callable[[Any], Any], *, target: str | None = None) -> Any:
        """Run `fn(engine)` between steps (the admin page's snapshot, a tenant's purge). `target`: the replica the
        request router sends the call to (None: any)."""
        if target is not None and target != self.name:
            raise RuntimeError(f"a call for replica {target} reached replica {self.name}")
        return await self.bridge.call(fn)

    async def info(self) -> tuple[EngineInfo, Any]:
        """What the ingress needs to know of this replica's engine (the same on every replica), and its tokenizer."""
        return self.bridge.info, self.bridge.tokenizer

    async def _refresh(self) -> None:
        """Take the engine's stats and cache digest between steps (the routing stats and the census read them)."""
        self.stats, cached = await self.bridge.call(lambda engine: (engine.stats(), engine.cache_digest()))
        self.stats_at = time.time()
        self.digest = ReplicaDigest.from_engine(
            self.name, cached, self.stats_at
        )  # sorted here, off the engine

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_PERIOD_S)
            try:
                await self._refresh()
            except Exception as exc:  # noqa: BLE001 - a dead engine: check_health reports it to Serve
                logger.warning("replica %s: taking the engine's stats failed: %s", self.name, exc)

    def record_routing_stats(self) -> dict[str, Any]:
        """This replica's identity, load and engine stats (as of `stats_at`), for the request router and the
        ingress's census (Serve pulls it every few hundred ms; the census once a second)."""
        return {
            **self.digest.to_stats(),
            "name": self.name,
            "rank": self.rank,
            "pid": self.pid,
            "healthy": self.bridge.healthy,
            "in_flight": self.bridge.num_in_flight,
            "engine_stats": self.stats,
            "taken_at": self.stats_at,
        }

    def check_health(self) -> None:
        """Serve restarts a replica whose engine thread died."""
        if not self.bridge.healthy:
            raise RuntimeError(f"engine not serving: {self.bridge.dead_reason or 'stopped'}")

    async def __del__(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        await self.bridge.stop()
