"""Engine statistics and a consistent picture of the KV block pool, as plain dataclasses for the admin page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.tier import TierStats


@dataclass(frozen=True)
class StepTiming:
    """Decode-only steps of one batch size timed inside the engine (EngineConfig.step_timing): totals since start.
    `step_s` is the whole engine.step() (scheduling, inputs, forward, sampling, detokenization); the linears' and
    attention's shares are `matmul_s` and `attention_s`, the rest is everything else."""

    batch_size: int
    num_steps: int
    step_s: float
    matmul_s: float
    attention_s: float


@dataclass(frozen=True)
class SpecStats:
    """Speculative decoding since start, as vLLM's spec_decode counters count it: a draft is one sequence's proposed
    tokens in one step, verified together."""

    method: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # [i]: drafts whose token i was accepted
    num_steps: int  # engine steps that verified at least one draft
    accepted_from_prompt: int = (
        0  # accepted tokens an n-gram proposal copied from the prompt (not from the reply)
    )

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(frozen=True)
class EngineStats:
    """Counters and gauges of one engine at one moment."""

    num_running: int
    num_waiting: int
    num_preemptions: int  # total since start
    num_blocks: int
    num_free_blocks: int  # ref 0, no hash
    num_cached_blocks: int  # ref 0 but holding a hash: free, evictable, still a prefix-cache hit
    num_used_blocks: int  # ref >= 1
    num_shared_blocks: int  # ref > 1
    num_tokens_stored: int  # sum of num_computed_tokens over running sequences
    num_slots_allocated: int  # sum of len(block_table) * block_size over running sequences
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_prompt_tokens_total: int  # of requests that got their first token, cached or not, once per request
    num_generation_tokens_total: int
    num_steps: int
    block_size: int
    max_model_len: int
    kv_cache_dtype: str = (
        ""  # what the pool stores: int8, float16, bfloat16, float32 ("" where no pool is known)
    )
    kv_block_bytes: int = 0  # bytes of one block over every layer, int8 scales included
    num_loading: int = 0  # sequences waiting for their prefix to load from the disk tier
    disk_hit_tokens: int = 0  # of prefix_hit_tokens, those loaded from the disk tier
    tier: TierStats | None = None  # the disk tier, when there is one
    num_computed_prompt_tokens_total: int = 0  # prompt tokens run through the model, recomputation included
    step_timings: tuple[StepTiming, ...] = ()  # per decode batch size, with step_timing on; else empty
    weight_bytes_blocks: int = 0  # the model's weights kept in quantized blocks (GGUF)
    weight_bytes_float: int = 0  # the model's weights in float (norms, biases, embedding, float linears)
    spec: SpecStats | None = None  # speculative decoding, when its method is not off
    memory_available_bytes: int = (
        0  # what the machine can still give (MemAvailable) when the stats were taken
    )

    @property
    def ram_hit_tokens(self) -> int:
        """Prompt tokens whose KV was still in the RAM pool at admission."""
        return self.prefix_hit_tokens - self.disk_hit_tokens

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes of the whole KV pool."""
        return self.num_blocks * self.kv_block_bytes

    @property
    def capacity_tokens(self) -> int:
        """Tokens of KV the whole pool holds."""
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class CacheDigest:
    """What a replica router needs of one engine: which blocks its prefix cache holds, and how busy it is."""

    # hash_chain.HASH_PREFIX_BYTES of each prefix-cache block's chain hash (in use or evictable), by block id;
    # zeros where a block holds no hash (BlockManager.cached_hash_prefixes)
    hash_prefixes: bytes
    num_running: int
    num_waiting: int  # queued for admission, or loading their prefix from the disk tier
    num_free_blocks: int  # ref-0 blocks, evictable cached ones included: the room an admission may take
    num_blocks: int
    max_num_seqs: int  # sequences the engine runs at once: past that, a new request waits
    block_size: int


@dataclass(frozen=True)
class PoolSnapshot:
    """Per-block state of the pool (0 free / 1 cached-evictable / 2 in use) and the live sequences' tables."""

    block_states: list[int]
    ref_counts: list[int]
    block_hash_prefixes: dict[int, str]  # block id -> first 8 hex chars of its hash
    # each: seq_id, request_id, block_table, num_tokens, num_computed_tokens, num_prompt_tokens, num_cached_tokens,
    # status
    sequences: list[dict[str, Any]]
    stats: EngineStats
