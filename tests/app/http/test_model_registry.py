"""The model registry (app/http/model_registry.py) with tiny real engines: a load nobody waits for any more still
ends (and is not stuck "loading"), a load that can never fit unloads nobody, an unload lets the engine go, a
deleted tenant's blocks leave the disk tiers of models that are not loaded, and with --replicas a model loads as a
replica set of its own whose every replica the budget counts."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from app.engine_client.async_engine import AsyncEngine, engine_factory
from app.http.model_catalog import model_entries
from app.http.model_registry import LOADED, NOT_LOADED, ModelLoadRefused, ModelRegistry, ReplicaSetFactory
from app.metrics.metrics import Metrics
from engine.core.block_names import BlockName
from engine.core.config import EngineConfig
from engine.core.hash_chain import salt_tag
from engine.core.memory import human_bytes
from tests.app.factories import make_settings, make_tiny_model_dir


def _registry(
    tmp_path, budget_bytes: int | None = None, replica_set: ReplicaSetFactory | None = None, **overrides
) -> ModelRegistry:
    settings = make_settings(
        tmp_path,
        make_tiny_model_dir(0),
        models=(f"second={make_tiny_model_dir(1)}", f"third={make_tiny_model_dir(2)}"),
        keep_alive_s=0.0,
        **overrides,
    )
    entries = model_entries(settings)
    return ModelRegistry(
        settings, entries, Metrics(entries[0].name), replica_set=replica_set, budget_bytes=budget_bytes
    )


async def _with_default(registry: ModelRegistry) -> AsyncEngine:
    """Start the default model's engine as the app does, on the registry's step loop."""
    default = AsyncEngine(engine_factory(registry.settings.engine_config()), step_loop=registry.step_loop)
    await default.start()
    registry.adopt_default(default, ())
    return default


async def _stop(registry: ModelRegistry, default: AsyncEngine) -> None:
    await registry.stop()
    await default.stop()


def test_a_load_whose_waiter_went_away_still_ends_and_the_model_serves(tmp_path):
    async def scenario() -> None:
        registry = _registry(tmp_path)
        default = await _with_default(registry)
        try:
            waiter = asyncio.create_task(registry.load("second"))
            await asyncio.sleep(0.05)
            assert registry.get("second").state == "loading"
            waiter.cancel()  # the only one waiting goes (a chat socket that closed)
            for _ in range(400):
                if registry.get("second").state != "loading":
                    break
                await asyncio.sleep(0.05)
            assert registry.get("second").state == LOADED
            async with registry.lease("second") as handle:
                assert handle.engine.healthy
        finally:
            await _stop(registry, default)

    asyncio.run(scenario())


def test_a_load_that_can_never_fit_unloads_nobody_and_an_unload_lets_the_engine_go(tmp_path):
    async def scenario() -> None:
        registry = _registry(tmp_path, budget_bytes=1 << 40)
        default = await _with_default(registry)
        try:
            second = await registry.load("second")
            engine_ref = weakref.ref(second.engine.engine)
            # now a budget too small for "third" even beside the default alone: unloading "second" would not help
            default_bytes = registry.get(registry.default_name).held_bytes
            registry.budget_bytes = default_bytes + registry.need_bytes(registry.get("third")) // 2
            with pytest.raises(
                ModelLoadRefused, match="cannot be loaded: it needs .* held: .*default model"
            ) as refused:
                await registry.load("third")
            # what is left once the idle "second" would be unloaded
            left = registry.budget_bytes - default_bytes
            assert f"has {human_bytes(left)} left" in refused.value.message
            assert registry.get("second").state == LOADED  # not unloaded for a load that could not fit anyway
            assert registry.get("third").state == NOT_LOADED  # refused for now, not a broken model
            del second
            assert await registry.unload("second")
            gc.collect()
            assert registry.get("second").state == NOT_LOADED and engine_ref() is None
        finally:
            await _stop(registry, default)

    asyncio.run(scenario())


def test_a_tenants_blocks_leave_the_disk_tiers_of_models_not_loaded(tmp_path):
    registry = _registry(tmp_path)
    tier = tmp_path / "cache" / "kv-models"
    mine, theirs = salt_tag("alice"), salt_tag("bob")
    for folder in ("second-x", "third-y/pagedchat-kv"):
        (tier / folder).mkdir(parents=True)
        for tag in (mine, theirs):  # named as the tier names its files
            (tier / folder / BlockName(bytes(16), tag, bytes(range(16))).filename).write_bytes(b"block")
        (tier / folder / f"notes-{mine.hex()}-x.kvb").write_bytes(b"not a block")  # no block name: kept
    # the registry's own folders for them: each model's id and a hash of it
    for model in ("second", "third"):
        folder = registry._config(registry.get(model)).kv_disk_dir
        assert folder.startswith(str(tier))
    (tier / "second-x").rename(registry._config(registry.get("second")).kv_disk_dir)
    (tier / "third-y").rename(registry._config(registry.get("third")).kv_disk_dir)
    assert registry.purge_unloaded("alice\nkey-1") == 2  # the tenant is the salt's first line
    left = sorted(p.name.split("-")[1] for p in tier.rglob("*.kvb"))
    assert left == sorted([theirs.hex(), theirs.hex(), mine.hex(), mine.hex()])
    assert sorted(p.name.startswith("notes-") for p in tier.rglob("*.kvb")) == [False, False, True, True]


class TwoReplicas(AsyncEngine):
    """A replica set's client as the registry sees it: one engine here stands for both replicas, which hold twice
    what it holds."""

    @property
    def held_bytes(self) -> int:
        return 2 * self.info.held_bytes


def test_with_replicas_a_model_loads_as_its_own_replica_set_and_the_budget_counts_each_replica(tmp_path):
    built: list[tuple[str, EngineConfig]] = []

    def replica_set(key: str, config: EngineConfig, metrics: Metrics) -> AsyncEngine:
        built.append((key, config))
        return TwoReplicas(engine_factory(config))

    async def scenario() -> None:
        registry = _registry(tmp_path, replica_set=replica_set, replicas=2)
        default = await _with_default(registry)
        try:
            second = registry.get("second")
            weights = (make_tiny_model_dir(1) / "model.safetensors").stat().st_size
            pool = registry.settings.engine.kv_cache_bytes
            assert registry.need_bytes(second) == 2 * (
                weights + pool
            )  # before it loads: each replica's share
            handle = await registry.load("second")
            [(key, config)] = built
            assert key.startswith("second-") and config.model == str(make_tiny_model_dir(1))
            assert second.held_bytes == 2 * handle.info.held_bytes == handle.engine.held_bytes
            assert registry.held_bytes == registry.get(registry.default_name).held_bytes + second.held_bytes
            assert await registry.unload("second") and registry.get("second").state == NOT_LOADED
        finally:
            await _stop(registry, default)

    asyncio.run(scenario())
