"""The models one server serves, loaded on demand within one memory budget.

`--model` loads at start and stays loaded: the chat's sessions and the admin page are its. Every other model
(`--models`, a repeated `--model`, `--models-dir`) loads on its first request, and unloads when it has been idle for
`--keep-alive-s`, or when a load needs its room: the least recently used idle model first, never one with a request
running. A load that cannot fit even then is refused with the numbers. Loads run one at a time, each on a loader
thread; every loaded engine steps on the one step loop (app/engine_client/step_loop.py), so the models' steps
alternate instead of stalling each other, and a load does not hold the others' steps.

What a model holds is its weights and its KV pool: before it loads, its weight files' bytes and the pool it will be
given (`--kv-cache-bytes`, else `ON_DEMAND_POOL_BYTES`); once loaded, what the engine reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine_client.async_engine import AsyncEngine, EngineFactory, engine_factory
from app.engine_client.protocol import EngineClient, EngineInfo
from app.engine_client.step_loop import StepLoop
from app.http.errors import APIError
from app.http.model_catalog import ModelEntry, weight_file_bytes
from app.http.public_prefix import PublicPrefixes
from app.metrics.metrics import Metrics
from app.settings import MODEL_BUDGET_SHARE, Settings
from engine.core.block_names import SUFFIX, BlockName
from engine.core.config import EngineConfig
from engine.core.hash_chain import salt_tag
from engine.core.memory import KV_BUDGET_FLOOR, available_memory_bytes, human_bytes, trim_heap
from engine.core.sampling_defaults import SamplingDefaults, default_sources, effective_defaults

logger = logging.getLogger(__name__)

ON_DEMAND_POOL_BYTES = KV_BUDGET_FLOOR  # a model loaded on demand without --kv-cache-bytes: its pool's bytes
REAP_INTERVAL_S = 1.0  # how often idle models are looked for
LOADED, LOADING, NOT_LOADED, FAILED = "loaded", "loading", "not_loaded", "failed"


# (a model's id in safe characters, its engine config, its metrics) -> its replica set's client (app/cluster)
ReplicaSetFactory = Callable[[str, EngineConfig, Metrics], EngineClient]


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model as a request uses it: its engine, the sampling defaults it fills in, its published prefixes."""

    name: str
    engine: EngineClient
    sampling_defaults: SamplingDefaults  # server flags > the model's generation config > built-in
    sampling_sources: dict[str, str]
    public_prefixes: PublicPrefixes

    @property
    def info(self) -> EngineInfo:
        return self.engine.info


@dataclass
class ServedModel:
    """One model's place in the registry."""

    entry: ModelEntry
    pinned: bool  # --model: loaded at start, never unloaded
    handle: ModelHandle | None = None
    loading: asyncio.Task | None = None
    loading_since: float | None = None
    last_used: float = 0.0
    leases: int = 0  # requests between picking the model and their engine holding them
    held_bytes: int = 0  # weights + pool, once loaded
    last_info: EngineInfo | None = None  # kept after an unload: max_model_len, pool size
    error: str | None = None  # why its last load failed or was refused, as a client may read it
    error_detail: str | None = None  # the cause as the log has it (the admin API shows it)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def state(self) -> str:
        if self.handle is not None:
            return LOADED
        if self.loading is not None:
            return LOADING
        return FAILED if self.error is not None else NOT_LOADED

    @property
    def loading_seconds(self) -> float | None:
        """How long its load has run so far (None: not loading)."""
        return None if self.loading_since is None else round(time.monotonic() - self.loading_since, 1)

    @property
    def busy(self) -> bool:
        """Running requests, or requests about to be given to its engine: never unloaded then."""
        return self.leases > 0 or (self.handle is not None and self.handle.engine.num_in_flight > 0)


class ModelNotServed(APIError):
    """A request named a model this server does not serve (404, naming those it does)."""

    def __init__(self, model: str, served: list[str]) -> None:
        names = ", ".join(repr(name) for name in served)
        super().__init__(
            404,
            f"model {model[:200]!r} not found; this server serves {names}",
            param="model",
            code="model_not_found",
        )


class ModelLoadRefused(APIError):
    """A model that would not fit in the memory budget even with every idle model unloaded (507)."""

    def __init__(self, message: str) -> None:
        super().__init__(507, message, param="model", code="model_does_not_fit")


class ModelRegistry:
    """Every served model by id; the loaded ones' handles; loads, unloads and the memory budget between them."""

    def __init__(
        self,
        settings: Settings,
        entries: tuple[ModelEntry, ...],
        metrics: Metrics,
        *,
        factory: Callable[[EngineConfig], EngineFactory] = engine_factory,
        replica_set: ReplicaSetFactory | None = None,
        budget_bytes: int | None = None,
    ) -> None:
        """`factory` builds an engine from a model's config (tests give tiny ones); `replica_set`, given with
        --replicas, builds a model's replica set instead; `budget_bytes`: the memory budget (unset:
        `--memory-budget`, else MODEL_BUDGET_SHARE of the memory available now)."""
        self.settings = settings
        self.metrics = metrics
        self.step_loop = StepLoop()
        self.budget_bytes = budget_bytes or settings.memory_budget_bytes or _default_budget()
        self._factory = factory
        self._replica_set = replica_set
        self.started_at = int(time.time())  # the `created` of a model whose files are not on disk yet
        self._models = {e.name: ServedModel(e, pinned=i == 0) for i, e in enumerate(entries)}
        self._load_lock = asyncio.Lock()
        self._reaper: asyncio.Task | None = None
        self._published: tuple[str, ...] = ()

    # ---- what is served -------------------------------------------------------------------------------------
    @property
    def default_name(self) -> str:
        return next(iter(self._models))

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def models(self) -> list[ServedModel]:
        return list(self._models.values())

    def get(self, name: str) -> ServedModel:
        model = self._models.get(name)
        if model is None:
            raise ModelNotServed(name, self.names)
        return model

    def loaded(self) -> list[ModelHandle]:
        return [m.handle for m in self._models.values() if m.handle is not None]

    @property
    def max_loaded(self) -> int:
        """The most models loaded at once: --models-max, else every one served (the budget may allow fewer)."""
        limit = self.settings.models_max
        return min(limit, len(self._models)) if limit else len(self._models)

    @property
    def held_bytes(self) -> int:
        return sum(m.held_bytes for m in self._models.values() if m.handle is not None)

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def adopt_default(self, engine: EngineClient, published: tuple[str, ...]) -> ModelHandle:
        """The default model has started: record it, and remember the published prompts for the others."""
        self._published = published
        model = next(iter(self._models.values()))
        handle = self._handle(model, engine)
        self._record_loaded(model, handle)
        if self.settings.keep_alive_s > 0 and len(self._models) > 1:
            self._reaper = asyncio.create_task(self._reap(), name="model-reaper")
        return handle

    async def stop(self) -> None:
        """Unload every model (the default's engine is the app's to stop) and end the reaper."""
        if self._reaper is not None:
            self._reaper.cancel()
        loads = [model.loading for model in self._models.values() if model.loading is not None]
        for load in loads:
            load.cancel()
        # each cancelled load cleans up after itself (an engine half started, a replica set half deployed) first
        await asyncio.gather(*loads, return_exceptions=True)
        for model in self._models.values():
            if model.handle is not None and not model.pinned:
                await self._unload(model)

    # ---- using a model --------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[ModelHandle]:
        """The model `name` (None: the default), loaded first if it is not: hold the lease until the request is in
        its engine (a lease, or a running request, keeps a model from being unloaded)."""
        model = self.get(name) if name is not None else next(iter(self._models.values()))
        model.leases += 1
        try:
            handle = await self._ensure_loaded(model)
            model.last_used = time.monotonic()
            yield handle
        finally:
            model.leases -= 1
            model.last_used = time.monotonic()

    async def load(self, name: str) -> ModelHandle:
        """Load `name` now (the admin's button): as a request would, without using it."""
        model = self.get(name)
        model.leases += 1
        try:
            return await self._ensure_loaded(model)
        finally:
            model.leases -= 1

    async def unload(self, name: str) -> bool:
        """Unload `name` now (the admin's button); ValueError for the default model, 409 for one with requests
        running. False when it was not loaded."""
        model = self.get(name)
        if model.pinned:
            raise ValueError(f"{name!r} is the server's --model: it stays loaded")
        if model.handle is None:
            return False
        async with self._load_lock:  # never beside a load: the budget counts what is really held
            if model.handle is None:
                return False
            if model.busy:
                raise APIError(
                    409, f"{name!r} has requests running; unload it once they finish", code="model_busy"
                )
            await self._unload(model)
        return True

    async def _ensure_loaded(self, model: ServedModel) -> ModelHandle:
        if model.handle is not None:
            return model.handle
        if model.loading is None:
            task = asyncio.create_task(self._load(model), name=f"load {model.name}")
            model.loading = task
            # cleared by the load itself, whether anyone still waits for it or not (a waiter may be cancelled)
            task.add_done_callback(lambda done: _forget_load(model, done))
        return await asyncio.shield(model.loading)

    # ---- loading and unloading ------------------------------------------------------------------------------
    def need_bytes(self, model: ServedModel) -> int:
        """What `model` will hold once loaded: what it held last time, else its weight files and its pool."""
        if model.held_bytes:
            return model.held_bytes
        weights = weight_file_bytes(model.entry.source) or 0
        return self.settings.replicas * (weights + self._pool_bytes())  # with --replicas, each one holds both

    def _pool_bytes(self) -> int:
        return self.settings.engine.kv_cache_bytes or ON_DEMAND_POOL_BYTES

    async def _load(self, model: ServedModel) -> ModelHandle:
        async with self._load_lock:  # one load at a time: two would only share the same two cores
            if model.handle is not None:
                return model.handle
            model.loading_since = time.monotonic()
            try:
                await self._make_room(model)
                config = self._config(model)
                client = self._client(model, config, lambda reason: self._died(model, reason))
                logger.info("loading model %s (%s)", model.name, model.entry.source)
                await client.start()
            except ModelLoadRefused:  # it did not fit now: not a broken model (its state stays not_loaded)
                model.loading_since = None
                raise
            except BaseException as exc:
                model.loading_since = None
                model.error_detail = f"{type(exc).__name__}: {exc}"
                model.error = "failed to load; the server's log says why"
                if isinstance(exc, Exception):
                    # the cause (a path, a parse error) is the operator's: the log and /api/admin/models have it
                    raise APIError(503, f"model {model.name!r} {model.error}", param="model") from exc
                raise
            model.loading_since = None
            model.error = model.error_detail = None
            handle = self._handle(model, client)
            self._record_loaded(model, handle)
            logger.info(
                "model %s loaded: %s held (weights and KV pool); %s of the %s budget held by %d models",
                model.name,
                human_bytes(model.held_bytes),
                human_bytes(self.held_bytes),
                human_bytes(self.budget_bytes),
                len(self.loaded()),
            )
            return handle

    async def _make_room(self, model: ServedModel) -> None:
        """Unload idle models, least recently used first, until `model` fits the budget and --models-max; else
        ModelLoadRefused with the numbers."""
        need = self.need_bytes(model)
        limit = self.settings.models_max
        kept = [m for m in self._models.values() if m.handle is not None and (m.pinned or m.busy)]
        if sum(m.held_bytes for m in kept) + need > self.budget_bytes or (limit and len(kept) >= limit):
            raise ModelLoadRefused(self._refusal(model, need, kept))  # unloading the idle ones would not do
        while True:
            loaded = [m for m in self._models.values() if m.handle is not None]
            fits = self.held_bytes + need <= self.budget_bytes and (not limit or len(loaded) < limit)
            if fits:
                return
            idle = sorted((m for m in loaded if not m.pinned and not m.busy), key=lambda m: m.last_used)
            if not idle:
                raise ModelLoadRefused(self._refusal(model, need, loaded))
            logger.info(
                "unloading model %s (least recently used) to make room for %s", idle[0].name, model.name
            )
            await self._unload(idle[0])

    def _refusal(self, model: ServedModel, need: int, kept: list[ServedModel]) -> str:
        """Why `model` cannot load, with the numbers; `kept`: the loaded models no unload may take (the default,
        those with requests running)."""
        held = ", ".join(
            f"{m.name} {human_bytes(m.held_bytes)}{' (the default model)' if m.pinned else ''}"
            f"{' (running requests)' if m.busy and not m.pinned else ''}"
            for m in kept
        )
        left = max(0, self.budget_bytes - sum(m.held_bytes for m in kept))
        if self.settings.models_max and len(kept) >= self.settings.models_max:
            why = f"--models-max {self.settings.models_max} models are loaded and none of them is idle"
        else:
            why = (
                f"it needs {human_bytes(need)} (weights and KV pool) and the memory budget of "
                f"{human_bytes(self.budget_bytes)} has {human_bytes(left)} left once every idle model is unloaded"
            )
        return f"model {model.name!r} cannot be loaded: {why}; held: {held or 'nothing'}"

    async def _unload(self, model: ServedModel) -> None:
        handle = model.handle
        if handle is None:
            return
        model.handle = None
        await handle.engine.stop()
        del handle
        gc.collect()  # the engine's tensors and mapped files go now, not at some later collection
        trim_heap()
        logger.info("model %s unloaded: %s freed", model.name, human_bytes(model.held_bytes))

    def purge_unloaded(self, cache_salt: str) -> int:
        """Delete a tenant's blocks from the disk tiers of the models not loaded now (a loaded one purges its own:
        `EngineClient.purge_cache_salt`), matched by name as the tier's own purge matches them; returns how many
        files went. (`--model` is always loaded.)"""
        if not self.settings.engine_config().kv_disk_dir:
            return 0
        tag = salt_tag(cache_salt)
        removed = 0
        for model in self._models.values():
            folder = Path(self._config(model).kv_disk_dir)
            if model.handle is not None or model.loading is not None or not folder.is_dir():
                continue
            for path in folder.rglob(f"*{SUFFIX}"):
                name = BlockName.parse(path.name)
                if name is not None and name.salt_tag == tag:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed += 1
        return removed

    def _died(self, model: ServedModel, reason: str) -> None:
        """An on-demand model's engine died while serving: it is not loaded any more (its next request loads it
        again)."""
        logger.error("model %s stopped serving: %s", model.name, reason)
        model.handle = None
        model.error, model.error_detail = "stopped serving; the server's log says why", reason

    async def _reap(self) -> None:
        """Unload models idle for longer than --keep-alive-s (idle: no request running, counted from when the last
        one ended, to a tick)."""
        keep = self.settings.keep_alive_s
        while True:
            await asyncio.sleep(min(REAP_INTERVAL_S, keep))
            now = time.monotonic()
            for model in list(self._models.values()):
                if model.handle is None or model.pinned:
                    continue
                if model.busy:
                    model.last_used = now  # idle from when its requests end, not from when they began
                    continue
                if now - model.last_used <= keep:
                    continue
                try:
                    async with self._load_lock:
                        if model.handle is not None and not model.busy:
                            logger.info(
                                "model %s idle for %.0f s: unloading it", model.name, now - model.last_used
                            )
                            await self._unload(model)
                except Exception:  # one failed unload must not end keep-alive for every model
                    logger.exception("unloading idle model %s failed", model.name)

    # ---- pieces ---------------------------------------------------------------------------------------------
    def _config(self, model: ServedModel) -> EngineConfig:
        """The model's engine config: the server's flags, its own source, its pool, and its own disk tier folder."""
        base = self.settings.engine_config()
        config = model.entry.config(base)
        replace: dict[str, Any] = {"kv_cache_bytes": self._pool_bytes()}
        if base.kv_disk_dir:  # beside the default model's tier, never inside it
            tier = Path(base.kv_disk_dir)
            replace["kv_disk_dir"] = str(tier.parent / f"{tier.name}-models" / _folder_name(model.name))
        return dataclasses.replace(config, **replace)

    def _client(
        self, model: ServedModel, config: EngineConfig, on_death: Callable[[str], None] | None
    ) -> EngineClient:
        settings = self.settings
        metrics = self.metrics if model.pinned else self.metrics.for_model(model.name)
        if self._replica_set is not None:  # --replicas: its own replica set (Ray Serve restarts a dead one)
            return self._replica_set(_folder_name(model.name), config, metrics)
        return AsyncEngine(
            self._factory(config),
            max_queued_requests=settings.max_queued_requests,
            request_timeout_s=settings.request_timeout_s,
            metrics=metrics,
            drain_s=settings.shutdown_grace_s,
            on_death=on_death,
            step_loop=self.step_loop,
        )

    def _handle(self, model: ServedModel, engine: EngineClient) -> ModelHandle:
        info = engine.info
        server = self.settings.sampling_defaults
        return ModelHandle(
            name=model.name,
            engine=engine,
            sampling_defaults=effective_defaults(server, info.sampling_defaults),
            sampling_sources=default_sources(server, info.sampling_defaults),
            public_prefixes=PublicPrefixes(engine.tokenizer, self._published),
        )

    def _record_loaded(self, model: ServedModel, handle: ModelHandle) -> None:
        model.handle, model.last_info = handle, handle.info
        model.held_bytes = handle.engine.held_bytes
        model.last_used = time.monotonic()


def _forget_load(model: ServedModel, task: asyncio.Task) -> None:
    if model.loading is task:
        model.loading = None
    if not task.cancelled():
        task.exception()  # retrieved: a failed load is reported to its waiters and in `error`, not as never retrieved


def _default_budget() -> int:
    available = available_memory_bytes()
    return int(MODEL_BUDGET_SHARE * available) if available else 8 << 30


def _folder_name(name: str) -> str:
    """A model id as a folder name: its safe characters and a short hash (ids may hold slashes)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:48] or "model"
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
