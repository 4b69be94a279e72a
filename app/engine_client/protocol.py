"""The app's one interface to the engine: `EngineClient` (what it can ask) and `EngineInfo` (what it may read).

Two clients implement it: `AsyncEngine` (one `LLMEngine` stepped on a thread of this process,
app/engine_client/async_engine.py) and `ReplicaSetEngine` (engine replicas on Ray Serve, app/cluster/). The rest of
the app holds an `EngineClient` and never the engine object: `tests/test_import_rules.py` keeps every module outside
this folder from importing `engine.llm_engine`, and `make test` type-checks both clients against the protocol (mypy,
`tests/typecheck/engine_clients.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from app.engine_client.request_label import RequestLabel
    from app.engine_client.request_stream import RequestStream
    from app.metrics.cluster_metrics import ReplicaSetReport
    from engine.core.config import EngineConfig
    from engine.core.hash_chain import BlockHasher
    from engine.core.memory import WeightMemory
    from engine.core.outputs import CachePurge
    from engine.core.sampling_defaults import SamplingDefaults
    from engine.core.sequence import SamplingParams
    from engine.core.stats import EngineStats, PoolSnapshot

T = TypeVar("T")


class EngineUnavailable(RuntimeError):
    """The engine thread is not serving: still starting, stopped, or dead (HTTP 503)."""


class EngineOverloaded(RuntimeError):
    """Too many requests are already waiting (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class EngineInfo:
    """What the app knows of the engine once it serves, fixed for its life (every replica has the same)."""

    model_name: str
    config: EngineConfig  # resolved: limits (max_model_len, max_num_seqs, ...), block size, prefix caching
    num_blocks: int  # the KV pool's blocks (each replica's)
    kv_block_bytes: int
    kv_int8_block_bytes: int | None  # what a block would take in an int8 pool (None: the pool is int8)
    kv_cache_dtype: str  # what the pool stores, resolved ("auto" decided)
    sampling_defaults: SamplingDefaults  # the model's generation config
    hasher: BlockHasher  # block size and pool salt: a replica set's router hashes chains with it
    vocab_size: int  # prompt token ids must be below it
    weight_memory: WeightMemory | None  # None: a replica set's front, which holds no weights
    tier_directory: str | None  # the KV disk tier's directory; None: no tier opened (or one per replica)
    tier_capacity_bytes: int | None  # its cap, resolved when it opened

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def held_bytes(self) -> int:
        """One engine's weights and KV pool (a replica set's front holds neither: 0 weights, its replicas' pool)."""
        weights = self.weight_memory.total if self.weight_memory is not None else 0
        return weights + self.num_blocks * self.kv_block_bytes

    @property
    def max_model_len(self) -> int:
        max_len = self.config.max_model_len
        assert max_len is not None  # the engine's config is resolved
        return max_len


@dataclass(frozen=True)
class PoolSample:
    """One engine's pool for the admin feed, taken between steps: the snapshot (the hashes of `hashed`'s blocks
    with it), how many waiting sequences were preempted, and the disk tier's directory (None: no tier)."""

    snapshot: PoolSnapshot
    hashed: range
    num_preempted: int
    tier_directory: str | None


class EngineClient(Protocol):
    """The engine as the app sees it: requests in, streams of outputs back, and figures taken between steps.

    Request methods raise ValueError (bad input: 400), `EngineOverloaded` and `EngineUnavailable` (503). Every
    engine of a replica set answers the `*_each` calls, as (engine name, result) pairs in rank order; one engine
    answers as "engine".
    """

    tokenizer: Any  # the event loop side's own copy: use it through `tokenize`
    dead_reason: str | None  # why the engine stopped serving (None: it has not)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def info(self) -> EngineInfo:
        """The engine's fixed facts (EngineUnavailable before it has started)."""
        ...

    @property
    def healthy(self) -> bool: ...

    def health(self) -> dict[str, Any] | None:
        """The replicas for /health (None: one engine, in this process)."""
        ...

    def replica_report(self) -> ReplicaSetReport | None:
        """The replica set for /metrics (None: one engine)."""
        ...

    @property
    def held_bytes(self) -> int:
        """The memory the model's engines hold: weights and KV pools, of every replica."""
        ...

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
    ) -> RequestStream: ...

    def abort(self, request_id: str) -> None: ...

    def is_running(self, request_id: str) -> bool: ...

    def end_request(self, request_id: str, error: BaseException) -> bool: ...

    def end_streams(self, error: BaseException) -> int: ...

    def label_of(self, request_id: str) -> RequestLabel | None: ...

    @property
    def num_in_flight(self) -> int: ...

    @property
    def num_pending_outputs(self) -> int: ...

    async def tokenize(self, fn: Callable[[Any], T]) -> T: ...

    async def stats(self) -> EngineStats:
        """The engine's counters (a replica set's merged)."""
        ...

    async def stats_each(self) -> list[tuple[str, EngineStats]]: ...

    async def snapshot_each(self) -> list[tuple[str, PoolSnapshot]]: ...

    async def pool_sample_each(self, hashed: Callable[[int], range]) -> list[tuple[str, PoolSample]]:
        """Each engine's pool, with the hashes of the blocks `hashed(its number of blocks)` names (picklable: a
        replica set sends it to its replicas)."""
        ...

    async def purge_cache_salt(self, cache_salt: str) -> list[CachePurge]:
        """Drop every cached block of `cache_salt` (a tenant) from each engine's pool and disk tier."""
        ...
