"""`ReplicaSetEngine`: the app's engine interface (`AsyncEngine`'s) over the engine replicas of a Serve deployment.

Requests go through the deployment handle, whose request router picks the replica (see `app.cluster.routing`):
the handle call carries the request's block-hash chain, computed here with the engines' own hasher. Each request's
outputs arrive as a Serve stream (`app.cluster.wire`) and are pushed into a local `RequestStream`, so the routes and
services read them exactly as from the in-process bridge. A replica that dies fails its in-flight requests with a
clean error; the next request goes to a live replica.

A census task asks every replica actor for its routing stats once a second: /health, the admin page and the
metrics read the replicas (name, pid, load, cached blocks) from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from app.cluster import ray_runtime
from app.cluster.routing import OUTCOMES, RouteKey
from app.cluster.routing_ledger import LEDGER, ReplicaRouting
from app.cluster.wire import Accepted, Failed, Rejected, with_prompt
from app.engine_client.protocol import EngineUnavailable
from app.engine_client.request_label import RequestLabel
from app.engine_client.request_stream import ReplicaLost, RequestFailed, RequestStream
from app.engine_client.stream_registry import StreamRegistry
from app.metrics.cluster_metrics import ReplicaHealth, ReplicaSetReport
from engine.core.hash_chain import ChainKey, num_cacheable_blocks
from engine.core.sequence import SamplingParams
from engine.core.stats import EngineStats

if TYPE_CHECKING:
    from app.metrics.metrics import Metrics
    from app.settings import Settings
    from engine.core.config import EngineConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")
CENSUS_PERIOD_S = 1.0
CENSUS_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 300.0  # a replica set's deploy, its model loads included


@dataclass
class ReplicaStatus:
    """One replica as the census last saw it."""

    name: str
    pid: int | None = None
    rank: int | None = None
    state: str = "starting"  # running, starting (not answering yet), unreachable
    stats: dict[str, Any] = field(default_factory=dict)
    seen_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "rank": self.rank,
            "state": self.state,
        }


class ReplicaSetEngine(StreamRegistry):
    """The engine replicas behind one interface; `start` deploys them (and starts Ray when asked to)."""

    def __init__(
        self,
        settings: Settings,
        *,
        engine_config: EngineConfig | None = None,
        app_name: str = ray_runtime.APP_NAME,
        num_models: int = 1,
        metrics: Metrics | None = None,
    ) -> None:
        """One model's replicas: `engine_config` (unset: --model's) deployed as the Serve application `app_name`;
        `num_models`: how many models' replicas the Ray instance this may start must make room for."""
        super().__init__(settings.request_timeout_s, metrics)
        self.settings = settings
        self.engine_config = engine_config or settings.engine_config()
        self.app_name = app_name
        self.num_models = num_models
        self.held_bytes = 0  # every replica's weights and pool, once they serve (EngineClient.held_bytes)
        self.tokenizer: Any = None
        self.ready = False
        self.dead_reason: str | None = None
        self.replicas: dict[str, ReplicaStatus] = {}
        self._handle: Any = None
        self._started_ray = False
        self._version = 1
        self._restarting = False
        self._deploying = asyncio.Lock()  # a rolling restart's deploy, or the stop that deletes the app
        self._pumps: dict[str, asyncio.Task] = {}
        self._replica_of: dict[str, str] = {}  # request id -> the replica serving it
        self._census_task: asyncio.Task | None = None
        self._seen: set[str] = set()  # every replica name the census or a request has met, dead ones included

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start or join Ray, deploy the replicas, and return once they serve."""
        try:
            self._started_ray = await asyncio.to_thread(ray_runtime.start_ray, self.settings, self.num_models)
            self._handle = await self._deploy_within(START_TIMEOUT_S)
            info, tokenizer = await self._handle.info.remote()
        except BaseException as exc:
            self.dead_reason = f"startup failed: {type(exc).__name__}: {exc}"
            await asyncio.to_thread(ray_runtime.stop, self._started_ray, self.app_name)
            raise
        self.held_bytes = self.settings.replicas * info.held_bytes
        # the front holds no weights, and each replica has a disk tier of its own (see their stats)
        self._info = dataclasses.replace(
            info, weight_memory=None, tier_directory=None, tier_capacity_bytes=None
        )
        self.tokenizer = tokenizer
        await self._take_census()
        self._census_task = asyncio.create_task(self._census_loop(), name=f"replica-census {self.app_name}")
        self.ready = True

    async def _deploy_within(self, timeout_s: float) -> Any:
        """Deploy, and give up after `timeout_s`: replicas the cluster has no room for wait in Serve for good (and a
        model's load would hold every other load and unload meanwhile). Deleting the application ends the wait."""
        deploying = asyncio.ensure_future(asyncio.to_thread(self._deploy))
        try:
            return await asyncio.wait_for(asyncio.shield(deploying), timeout_s)
        except asyncio.TimeoutError:
            states = await asyncio.to_thread(ray_runtime.replica_states, self.app_name)
            await asyncio.to_thread(ray_runtime.stop, False, self.app_name)
            with contextlib.suppress(Exception):  # Serve's wait ends: the application is gone
                await deploying
            waiting = (
                ", ".join(f"{n} {state.lower()}" for state, n in sorted(states.items())) or "none started"
            )
            raise ValueError(
                f"the engine replicas of {self.app_name} did not start within {timeout_s:.0f} s (replicas: "
                f"{waiting}); a replica pending allocation means the Ray cluster has no room for it"
            ) from None

    def _deploy(self) -> Any:
        return ray_runtime.deploy(self.settings, self.engine_config, self.app_name, str(self._version))

    async def stop(self) -> None:
        """End the streams, delete the replicas (they drain), and stop Ray if this process started it."""
        self.ready = False
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._census_task is not None:
            self._census_task.cancel()
        # after a rolling restart under way: it would deploy the deleted app again
        try:
            async with self._deploying:
                await asyncio.to_thread(ray_runtime.stop, self._started_ray, self.app_name)
        finally:
            LEDGER.forget(self._seen)  # the replicas are gone, and their routing counts with them
        self._tokenizer_executor.shutdown(wait=False, cancel_futures=True)

    async def rolling_restart(self) -> None:
        """Redeploy under a new version: Serve replaces the replicas one at a time, each draining its requests
        first (up to shutdown_grace_s), while the others serve. The handle stays: its router keeps its memory."""
        if self._restarting:
            logger.warning("a rolling restart is already running")
            return
        self._restarting = True
        try:
            async with self._deploying:
                if not self.ready:  # stopped (unloaded) meanwhile: nothing left to restart
                    return
                self._version += 1
                logger.warning(
                    "rolling restart of the engine replicas of %s (generation %d)",
                    self.app_name,
                    self._version,
                )
                await asyncio.to_thread(self._deploy)
        except Exception:
            logger.exception("the rolling restart of %s failed", self.app_name)
        else:
            logger.warning(
                "rolling restart of %s done: every replica is of generation %d", self.app_name, self._version
            )
        finally:
            self._restarting = False

    @property
    def num_ready(self) -> int:
        return sum(1 for r in self.replicas.values() if r.state == "running")

    @property
    def healthy(self) -> bool:
        """True while at least one replica serves."""
        return self.ready and self.dead_reason is None and self.num_ready > 0

    def health(self) -> dict[str, Any]:
        """The replicas for /health: how many were asked for, how many serve, and each one."""
        return {
            "asked": self.settings.replicas,
            "ready": self.num_ready,
            "replicas": [
                {**r.to_json(), "in_flight": self.num_in_flight_on(r.name)}
                for r in sorted(self.replicas.values(), key=lambda r: (r.rank or 0, r.name))
            ],
        }

    def num_in_flight_on(self, replica: str) -> int:
        """Requests this ingress is streaming from `replica`."""
        return sum(1 for name in self._replica_of.values() if name == replica)

    def _check_serving(self) -> None:
        if self.dead_reason is not None:
            raise EngineUnavailable(f"the engine replicas are not running: {self.dead_reason}")
        if not self.ready:
            raise EngineUnavailable("the engine replicas are not ready yet")
        if self.num_ready == 0:
            raise EngineUnavailable("no engine replica is serving; Ray Serve is restarting them")

    # ---- requests -------------------------------------------------------------------------------------------
    def route_chain(
        self, prompt: list[int], cache_salt: str | None, public_prefix_len: int
    ) -> tuple[bytes, ...]:
        """The request's block-hash chain, as the replicas' block managers compute it."""
        hasher = self.info.hasher
        key = ChainKey(cache_salt, public_prefix_len)
        num_blocks = num_cacheable_blocks(len(prompt), hasher.block_size)
        hashes: list[bytes] = []
        hasher.extend(hashes, prompt, key, num_blocks)
        return tuple(hashes)

    async def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        public_prefix_len: int = 0,
        label: RequestLabel | None = None,
        session: str | None = None,
    ) -> RequestStream:
        """Send a request to a replica; raises ValueError (bad input), EngineOverloaded or EngineUnavailable."""
        self._check_serving()
        self._check_request(prompt, params, public_prefix_len)
        route = RouteKey.from_chain(self.route_chain(prompt, cache_salt, public_prefix_len), session)
        stream = self._open_stream(request_id, label)
        try:
            call = self._handle.options(stream=True).generate.remote(
                request_id,
                prompt,
                params,
                cache_salt=cache_salt,
                public_prefix_len=public_prefix_len,
                route=route,
            )
            first = await call.__anext__()
        except BaseException as exc:
            stream.close()
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise EngineUnavailable(
                f"no engine replica took the request: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(first, Rejected):
            stream.close()
            raise first.to_error()
        assert isinstance(first, Accepted), first
        self._replica_of[request_id] = first.replica
        self._seen.add(first.replica)
        self._pumps[request_id] = asyncio.create_task(
            self._pump(request_id, prompt, call, stream, first.replica), name=f"pump-{request_id}"
        )
        return stream

    async def _pump(
        self, request_id: str, prompt: list[int], call: Any, stream: RequestStream, replica: str
    ) -> None:
        """Move a request's outputs from its replica's stream into its local stream."""
        try:
            async for item in call:
                if isinstance(item, Failed):
                    stream.fail(item.to_error())
                    return
                output = with_prompt(item, prompt)
                if output.finished and self.metrics is not None:
                    self.metrics.observe_request(output)
                stream.push(output)
                if output.finished:
                    return
            stream.fail(RequestFailed(f"replica {replica} ended the reply without finishing it"))
        except asyncio.CancelledError:
            call.cancel()  # the client went: the replica aborts the request
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died or its stream broke: this request fails
            logger.warning(
                "request %s lost its replica %s: %s: %s", request_id, replica, type(exc).__name__, exc
            )
            lost = self.replicas.get(replica)
            if lost is not None:  # /health says so now, not at the next census
                lost.state = "unreachable"
            stream.fail(
                ReplicaLost(f"the engine replica serving this reply stopped ({type(exc).__name__}); retry")
            )
        finally:
            self._pumps.pop(request_id, None)

    def _cancel(self, request_id: str) -> None:
        """Cancel the request's handle call: its replica aborts it."""
        pump = self._pumps.pop(request_id, None)
        if pump is not None:
            pump.cancel()

    def _unregister(self, request_id: str) -> None:
        super()._unregister(request_id)
        self._replica_of.pop(request_id, None)

    # ---- calls on the engines -------------------------------------------------------------------------------
    async def call_on(self, replica: str, fn: Callable[[Any], T]) -> T:
        """Run `fn(engine)` between steps on the engine of `replica` (LookupError: it is not serving)."""
        self._check_serving()
        return await asyncio.wait_for(self._handle.call.remote(fn, target=replica), CALL_TIMEOUT_S)

    async def call_each(self, fn: Callable[[Any], T]) -> list[tuple[str, T]]:
        """`fn(engine)` on every serving replica: (replica, result) of each that answered; raises only when none
        did. A replica that fails the call is left out (and logged): it is dead or restarting."""
        self._check_serving()
        names = [status.name for status in self._serving()]
        results = await asyncio.gather(*(self.call_on(name, fn) for name in names), return_exceptions=True)
        answered = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning(
                    "replica %s did not answer a call: %s: %s", name, type(result).__name__, result
                )
            else:
                answered.append((name, result))
        if not answered:
            raise EngineUnavailable("no engine replica answered")
        return answered

    def _serving(self) -> list[ReplicaStatus]:
        return [
            s
            for s in sorted(self.replicas.values(), key=lambda r: (r.rank or 0, r.name))
            if s.state == "running"
        ]

    def replica_stats(self) -> list[tuple[str, EngineStats]]:
        """Each serving replica's engine stats, as its last census answer carried them."""
        found = []
        for status in sorted(self.replicas.values(), key=lambda r: (r.rank or 0, r.name)):
            stats = status.stats.get("engine_stats")
            if status.state == "running" and stats is not None:
                found.append((status.name, stats))
        return found

    def routing(self) -> dict[str, ReplicaRouting]:
        """The ingress's routing decisions per replica: every replica that got a request (dead ones kept: the
        counts are totals), and every replica the census knows, with zeros until it gets one."""
        unrouted = ReplicaRouting(dict.fromkeys(OUTCOMES, 0), 0, 0, 0, 0)
        # the ledger is the process's, shared by every model's router: this set's replicas are those it has seen
        routed = {name: r for name, r in LEDGER.snapshot().items() if name in self._seen}
        return {**dict.fromkeys(self.replicas, unrouted), **routed}

    def replica_report(self) -> ReplicaSetReport:
        """The replicas for /metrics: asked, each one's health and engine stats, and the routing decisions."""
        return ReplicaSetReport(
            asked=self.settings.replicas,
            replicas=[
                ReplicaHealth(r.name, r.state == "running")
                for r in sorted(self.replicas.values(), key=lambda r: (r.rank or 0, r.name))
            ],
            stats=self.replica_stats(),
            routing=self.routing(),
        )

    async def stats(self) -> EngineStats:
        """The serving replicas' stats added up (counters and block counts; the disk tiers stay per replica)."""
        self._check_serving()
        return merge_stats([stats for _, stats in self.replica_stats()])

    # ---- the census -----------------------------------------------------------------------------------------
    async def _census_loop(self) -> None:
        while True:
            await asyncio.sleep(CENSUS_PERIOD_S)
            try:
                await self._take_census()
            except Exception:  # noqa: BLE001 - a failed census leaves the last one; the next may succeed
                logger.exception("replica census failed")

    async def _take_census(self) -> None:
        actors = await asyncio.to_thread(ray_runtime.replica_actors, self.app_name)

        async def ask(name: str, actor: Any) -> ReplicaStatus:
            status = self.replicas.get(name) or ReplicaStatus(name)
            try:
                stats = await asyncio.wait_for(actor.record_routing_stats.remote(), CENSUS_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - starting (no user code yet), dead, or stuck
                status.state = "unreachable" if status.state == "running" else "starting"
                logger.debug("replica %s did not answer the census: %s", name, exc)
                return status
            status.stats, status.seen_at = stats, time.time()
            status.pid, status.rank = stats.get("pid"), stats.get("rank")
            status.state = "running" if stats.get("healthy") else "unreachable"
            return status

        found = await asyncio.gather(*(ask(name, actor) for name, actor in actors))
        self.replicas = {status.name: status for status in found}
        self._seen.update(self.replicas)


_RESTARTS: set[asyncio.Task] = set()  # the rolling restarts under way (a task nobody holds may be collected)


def restart_on_sighup(engines: Callable[[], list[Any]]) -> None:
    """`kill -HUP <server pid>` restarts the replicas of every loaded model, each set one replica at a time (the
    way `serve deploy` rolls them); `engines`: the loaded models' engine clients, as the signal finds them."""

    def on_hup() -> None:
        for engine in engines():
            if isinstance(engine, ReplicaSetEngine):
                task = asyncio.create_task(
                    engine.rolling_restart(), name=f"rolling-restart {engine.app_name}"
                )
                _RESTARTS.add(task)
                task.add_done_callback(_RESTARTS.discard)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: no signal to take
        logger.info("no SIGHUP handler here: rolling restarts need the server's main thread")


# memory_available_bytes: the machine's, which the replicas share
_SAME_ON_EVERY_REPLICA = {
    "block_size",
    "max_model_len",
    "kv_cache_dtype",
    "kv_block_bytes",
    "memory_available_bytes",
}


def merge_stats(parts: list[EngineStats]) -> EngineStats:
    """Several engines' stats as one: every count summed, the pool's shape kept, the disk tiers left out."""
    if not parts:
        raise EngineUnavailable("no engine replica has reported its stats yet")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(EngineStats):
        if f.name == "tier":
            values[f.name] = None
        elif f.name in _SAME_ON_EVERY_REPLICA:
            values[f.name] = getattr(parts[0], f.name)
        else:
            values[f.name] = sum(getattr(p, f.name) for p in parts)
    return EngineStats(**values)
