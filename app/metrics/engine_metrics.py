"""The engine's gauges and counters for Prometheus, read from EngineStats taken on the engine thread: one engine's
(labelled by model), or each replica's of a replica set (labelled by model and replica)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core.stats import EngineStats

PREFIX = "pagedchat:"

# (name, doc, TierStats field): the disk tier's gauges, then its counters since start
TIER_GAUGES = (
    ("kv_disk_capacity_bytes", "Byte cap of the KV disk tier.", "capacity_bytes"),
    ("kv_disk_used_bytes", "Bytes of block files in the disk tier's directory.", "used_bytes"),
    ("kv_disk_blocks", "Blocks of this model the disk tier holds.", "num_blocks"),
    ("kv_disk_files", "Block files in the disk tier's directory, other models' included.", "num_files"),
    ("kv_disk_write_queue_depth", "Blocks queued for writing to the disk tier.", "write_queue_depth"),
    ("kv_disk_write_lag_seconds", "Age of the oldest block queued but not yet on disk.", "write_lag_seconds"),
)
TIER_COUNTERS = (
    ("kv_disk_writes", "Blocks written to the disk tier.", "num_writes"),
    ("kv_disk_write_drops", "Blocks not written because the write queue was full.", "num_write_drops"),
    (
        "kv_disk_write_errors",
        "Block writes that failed (the tier then turns itself off).",
        "num_write_errors",
    ),
    ("kv_disk_loads", "Prefix loads from the disk tier.", "num_loads"),
    ("kv_disk_loaded_blocks", "Blocks read from the disk tier into the pool.", "num_loaded_blocks"),
    ("kv_disk_load_failures", "Blocks gone, torn or corrupt at read time (recomputed).", "num_load_failures"),
    ("kv_disk_load_seconds", "Seconds spent loading prefixes from the disk tier.", "load_seconds_total"),
    ("kv_disk_evictions", "Block files evicted to keep the disk tier within its cap.", "num_evictions"),
    ("kv_disk_lookups", "Admissions that looked in the disk tier past their RAM hits.", "num_lookups"),
    (
        "kv_disk_lookups_evicted",
        "Disk tier lookups that stopped at a block the tier had held but evicted.",
        "num_lookups_evicted",
    ),
)


class Families:
    """Metric families filled sample by sample: one family per name (made by its first sample), in that order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, kind: str, name: str, doc: str, labels: dict[str, str], value: float) -> None:
        """One sample of family `name` (a "gauge" or a "counter"; a counter's samples are named `name_total`)."""
        family = self._families.get(name)
        if family is None:
            make = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            family = self._families[name] = make(PREFIX + name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def add_engine_samples(out: Families, stats: EngineStats, labels: dict[str, str]) -> None:
    """One engine's samples, each with `labels` (model_name, and the replica's name on a replica set)."""

    def gauge(name: str, doc: str, value: float, **extra: str) -> None:
        out.add("gauge", name, doc, {**labels, **extra}, value)

    def counter(name: str, doc: str, value: float, **extra: str) -> None:
        out.add("counter", name, doc, {**labels, **extra}, value)

    usage = stats.num_used_blocks / stats.num_blocks if stats.num_blocks else 0.0
    gauge("kv_cache_usage_perc", "KV cache usage: fraction of blocks in use (1 = 100%).", usage)
    gauge("num_requests_running", "Sequences in the running batch.", stats.num_running)
    gauge("num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting)
    gauge("num_requests_loading", "Sequences waiting for their prefix to load from disk.", stats.num_loading)
    gauge("kv_cache_blocks_total", "Blocks in the KV pool.", stats.num_blocks)
    gauge("kv_cache_capacity_tokens", "Tokens of KV the whole pool holds.", stats.capacity_tokens)
    if stats.kv_cache_dtype:
        gauge("kv_cache_info", "What the KV pool stores (always 1).", 1, kv_cache_dtype=stats.kv_cache_dtype)
        gauge(
            "kv_cache_bytes_per_token",
            "Bytes of KV one token takes over every layer (scales included).",
            stats.kv_block_bytes / stats.block_size,
        )
    gauge("kv_cache_pool_bytes", "Bytes of the whole KV pool.", stats.kv_pool_bytes)
    weights = "Bytes of the model's weights: in quantized blocks, or in float."
    gauge("model_weight_bytes", weights, stats.weight_bytes_blocks, kind="blocks")
    gauge("model_weight_bytes", weights, stats.weight_bytes_float, kind="float")
    gauge(
        "memory_available_bytes",
        "Memory the machine can still give (MemAvailable).",
        stats.memory_available_bytes,
    )
    gauge("kv_cache_blocks_free", "Free blocks holding no cached prefix.", stats.num_free_blocks)
    gauge(
        "kv_cache_blocks_cached",
        "Free blocks still holding a cached prefix (evictable).",
        stats.num_cached_blocks,
    )
    gauge("kv_cache_blocks_shared", "Blocks referenced by more than one sequence.", stats.num_shared_blocks)
    counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_query_tokens)
    counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.", stats.prefix_hit_tokens)
    by_tier = "Prompt tokens served from the prefix cache, by where their KV was: ram (the pool) or disk."
    counter("prefix_cache_hits_by_tier", by_tier, stats.ram_hit_tokens, tier="ram")
    counter("prefix_cache_hits_by_tier", by_tier, stats.disk_hit_tokens, tier="disk")
    counter(
        "num_preemptions",
        "Sequences preempted (recomputed later) for lack of KV blocks.",
        stats.num_preemptions,
    )
    counter(
        "prompt_tokens",
        "Prompt tokens of requests that got their first token, cached or not (vLLM's meaning).",
        stats.num_prompt_tokens_total,
    )
    counter(
        "prompt_tokens_computed",
        "Prompt tokens run through the model: cache hits excluded, recomputation after a preemption included.",
        stats.num_computed_prompt_tokens_total,
    )
    counter("generation_tokens", "Tokens generated.", stats.num_generation_tokens_total)
    counter("engine_steps", "Engine steps run.", stats.num_steps)
    # --step-timing: decode-only steps per batch size, and their seconds split into matmul / attention / rest
    timed = "Decode-only steps timed inside the engine (--step-timing), by batch size."
    split = (
        "Seconds of timed decode-only steps (--step-timing), by batch size and part: matmul, attention, rest."
    )
    for t in stats.step_timings:
        size = str(t.batch_size)
        counter("decode_steps_timed", timed, t.num_steps, batch_size=size)
        rest = t.step_s - t.matmul_s - t.attention_s
        for part, seconds in (("matmul", t.matmul_s), ("attention", t.attention_s), ("rest", rest)):
            counter("decode_step_seconds", split, seconds, batch_size=size, part=part)
    spec = stats.spec
    if spec is not None:  # vLLM's spec_decode counters: a draft is one sequence's proposed tokens in one step
        counter(
            "spec_decode_num_drafts",
            "Drafts verified (one sequence's proposed tokens in one step).",
            spec.num_drafts,
        )
        counter("spec_decode_num_draft_tokens", "Proposed tokens verified.", spec.num_draft_tokens)
        counter("spec_decode_num_accepted_tokens", "Proposed tokens accepted.", spec.num_accepted_tokens)
        per_pos = "Drafts whose token at this position was accepted."
        for position, accepted in enumerate(spec.accepted_per_position):
            counter("spec_decode_num_accepted_tokens_per_pos", per_pos, accepted, position=str(position))
    tier = stats.tier
    # no tier: only that it is off; a tier turned off after an error keeps reporting its counters
    gauge(
        "kv_disk_enabled", "Whether the KV disk tier is on (1) or off (0).", int(bool(tier and tier.enabled))
    )
    if tier is not None:
        for name, doc, attr in TIER_GAUGES:
            gauge(name, doc, getattr(tier, attr))
        for name, doc, attr in TIER_COUNTERS:
            counter(name, doc, getattr(tier, attr))


class EngineStatsCollector(Collector):
    """The engine series of the last stats set: one engine's (no replica label) or each replica's; then those of
    the other loaded models (several models), in the same shape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: EngineStats | None = None  # one engine
        self.replica_stats: Sequence[tuple[str, EngineStats]] | None = None  # a replica set: (replica, stats)
        # the other loaded models: (model, replica (None: one engine), stats)
        self.other_models: Sequence[tuple[str, str | None, EngineStats]] = ()

    def collect(self) -> Iterator[Metric]:
        out = Families()
        if self.replica_stats is not None:
            for replica, stats in self.replica_stats:
                add_engine_samples(out, stats, {"model_name": self.model_name, "replica": replica})
        elif self.stats is not None:
            add_engine_samples(out, self.stats, {"model_name": self.model_name})
        for model, replica, stats in self.other_models:
            labels = {"model_name": model} if replica is None else {"model_name": model, "replica": replica}
            add_engine_samples(out, stats, labels)
        yield from out
