"""What the engine clients run on an engine between its steps (on its thread, in this process or a replica's): the
`EngineInfo` it starts with, and the figures the app asks of every engine. Plain functions and picklable callables,
so that a replica set can send them to its replicas as they are."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.engine_client.protocol import EngineInfo, PoolSample

if TYPE_CHECKING:
    from engine.core.outputs import CachePurge
    from engine.core.stats import EngineStats, PoolSnapshot
    from engine.llm_engine import LLMEngine


def engine_info(engine: LLMEngine) -> EngineInfo:
    """The engine's fixed facts, read once when it has started."""
    return EngineInfo(
        model_name=engine.model_name,
        config=engine.config,
        num_blocks=engine.num_blocks,
        kv_block_bytes=engine.kv_block_bytes,
        kv_int8_block_bytes=engine.kv_int8_block_bytes,
        kv_cache_dtype=engine.kv_cache_dtype,
        sampling_defaults=engine.sampling_defaults,
        hasher=engine.scheduler.block_manager.hasher,
        vocab_size=engine.vocab_size,
        weight_memory=engine.weight_memory,
        tier_directory=_tier_directory(engine),
        tier_capacity_bytes=engine.tier.capacity_bytes if engine.tier is not None else None,
    )


def stats(engine: LLMEngine) -> EngineStats:
    return engine.stats()


def snapshot(engine: LLMEngine) -> PoolSnapshot:
    return engine.snapshot()


@dataclass(frozen=True)
class PoolSampler:
    """The admin feed's sample of a pool, with the hashes of the blocks `hashed(the pool's number of blocks)`
    names (each replica sizes its own pool)."""

    hashed: Callable[[int], range]

    def __call__(self, engine: LLMEngine) -> PoolSample:
        hashed = self.hashed(engine.num_blocks)
        return PoolSample(
            snapshot=engine.snapshot(hashed),
            hashed=hashed,
            num_preempted=sum(1 for seq in engine.scheduler.waiting if seq.num_preemptions > 0),
            tier_directory=_tier_directory(engine),
        )


@dataclass(frozen=True)
class SaltPurger:
    """Purge one cache salt's blocks from the pool and the disk tier."""

    cache_salt: str

    def __call__(self, engine: LLMEngine) -> CachePurge:
        return engine.purge_cache_salt(self.cache_salt)


def _tier_directory(engine: LLMEngine) -> str | None:
    return str(engine.tier.directory) if engine.tier is not None else None
