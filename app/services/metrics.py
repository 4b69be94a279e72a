"""Prometheus metrics with vLLM-style names, on a registry owned by one app (no global state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core.outputs import RequestOutput
from engine.core.stats import EngineStats

PREFIX = "pagedchat:"
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
)
# request phases: vLLM's request time buckets
REQUEST_TIME_BUCKETS = (*E2E_BUCKETS, 7680.0)
TPOT_BUCKETS = (*ITL_BUCKETS, 160.0, 640.0)
# request lengths in tokens: 1, 2, 5, 10, 20, 50, ... (vLLM's 1-2-5 series, here up to a million tokens)
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
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


class _EngineStatsCollector(Collector):
    """Gauges and counters read from the last EngineStats taken on the engine thread."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        if stats is None:
            return
        labels = ["model_name"]
        values = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> Metric:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> Metric:
            family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        usage = stats.num_used_blocks / stats.num_blocks if stats.num_blocks else 0.0
        yield gauge("kv_cache_usage_perc", "KV cache usage: fraction of blocks in use (1 = 100%).", usage)
        yield gauge("num_requests_running", "Sequences in the running batch.", stats.num_running)
        yield gauge("num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting)
        yield gauge(
            "num_requests_loading", "Sequences waiting for their prefix to load from disk.", stats.num_loading
        )
        yield gauge("kv_cache_blocks_total", "Blocks in the KV pool.", stats.num_blocks)
        yield gauge("kv_cache_capacity_tokens", "Tokens of KV the whole pool holds.", stats.capacity_tokens)
        if stats.kv_cache_dtype:
            info = GaugeMetricFamily(
                PREFIX + "kv_cache_info",
                "What the KV pool stores (always 1).",
                labels=[*labels, "kv_cache_dtype"],
            )
            info.add_metric([*values, stats.kv_cache_dtype], 1)
            yield info
            yield gauge(
                "kv_cache_bytes_per_token",
                "Bytes of KV one token takes over every layer (scales included).",
                stats.kv_block_bytes / stats.block_size,
            )
        yield gauge("kv_cache_blocks_free", "Free blocks holding no cached prefix.", stats.num_free_blocks)
        yield gauge(
            "kv_cache_blocks_cached",
            "Free blocks still holding a cached prefix (evictable).",
            stats.num_cached_blocks,
        )
        yield gauge(
            "kv_cache_blocks_shared", "Blocks referenced by more than one sequence.", stats.num_shared_blocks
        )
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_query_tokens
        )
        yield counter(
            "prefix_cache_hits", "Prompt tokens served from the prefix cache.", stats.prefix_hit_tokens
        )
        by_tier = CounterMetricFamily(
            PREFIX + "prefix_cache_hits_by_tier",
            "Prompt tokens served from the prefix cache, by where their KV was: ram (the pool) or disk.",
            labels=[*labels, "tier"],
        )
        by_tier.add_metric([*values, "ram"], stats.ram_hit_tokens)
        by_tier.add_metric([*values, "disk"], stats.disk_hit_tokens)
        yield by_tier
        yield counter(
            "num_preemptions",
            "Sequences preempted (recomputed later) for lack of KV blocks.",
            stats.num_preemptions,
        )
        yield counter(
            "prompt_tokens",
            "Prompt tokens of requests that got their first token, cached or not (vLLM's meaning).",
            stats.num_prompt_tokens_total,
        )
        yield counter(
            "prompt_tokens_computed",
            "Prompt tokens run through the model: cache hits excluded, recomputation after a preemption included.",
            stats.num_computed_prompt_tokens_total,
        )
        yield counter("generation_tokens", "Tokens generated.", stats.num_generation_tokens_total)
        yield counter("engine_steps", "Engine steps run.", stats.num_steps)
        tier = stats.tier
        # no tier: only that it is off; a tier turned off after an error keeps reporting its counters
        yield gauge(
            "kv_disk_enabled",
            "Whether the KV disk tier is on (1) or off (0).",
            int(bool(tier and tier.enabled)),
        )
        if tier is not None:
            for name, doc, attr in TIER_GAUGES:
                yield gauge(name, doc, getattr(tier, attr))
            for name, doc, attr in TIER_COUNTERS:
                yield counter(name, doc, getattr(tier, attr))


class Metrics:
    """All of one app's metrics. Latencies are observed on the event loop; engine stats are set before a scrape."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._engine = _EngineStatsCollector(model_name)
        self.registry.register(self._engine)
        self.time_to_first_token = self._histogram(
            "time_to_first_token_seconds", "Time from submission to the first token.", TTFT_BUCKETS
        )
        self.inter_token_latency = self._histogram(
            "inter_token_latency_seconds", "Time between consecutive tokens of a request.", ITL_BUCKETS
        )
        self.e2e_latency = self._histogram(
            "e2e_request_latency_seconds", "Time from submission to the request's end.", E2E_BUCKETS
        )
        self.queue_time = self._histogram(
            "request_queue_time_seconds",
            "Time a request waited in the engine before its first step (a disk-tier load included).",
            REQUEST_TIME_BUCKETS,
        )
        self.prefill_time = self._histogram(
            "request_prefill_time_seconds",
            "Time from a request's first step to its first token.",
            REQUEST_TIME_BUCKETS,
        )
        self.decode_time = self._histogram(
            "request_decode_time_seconds",
            "Time from a request's first token to its last.",
            REQUEST_TIME_BUCKETS,
        )
        self.inference_time = self._histogram(
            "request_inference_time_seconds",
            "Time from a request's first step to its last token (prefill + decode).",
            REQUEST_TIME_BUCKETS,
        )
        self.time_per_output_token = self._histogram(
            "request_time_per_output_token_seconds",
            "A request's decode time over its tokens after the first.",
            TPOT_BUCKETS,
        )
        self.prompt_length = self._histogram(
            "request_prompt_tokens", "Prompt tokens of each finished request (cached or not).", TOKEN_BUCKETS
        )
        self.generation_length = self._histogram(
            "request_generation_tokens",
            "Tokens each finished request generated, over all its samples.",
            TOKEN_BUCKETS,
        )
        # resident memory, CPU seconds, open fds, start time: process_* as in vLLM's (default) registry
        ProcessCollector(registry=self.registry)
        self.request_finished = Counter(
            PREFIX + "request_success",
            "Requests ended, by finish reason (stop, length, abort, error).",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.http_errors = Counter(
            PREFIX + "http_errors",
            "Error responses sent, by status.",
            ["status"],
            registry=self.registry,
        )

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry)

    def set_model_name(self, model_name: str) -> None:
        """Label values once the engine has loaded its model."""
        self.model_name = model_name
        self._engine.model_name = model_name

    def observe_first_token(self, seconds: float) -> None:
        """Record a request's time to first token."""
        self.time_to_first_token.labels(self.model_name).observe(seconds)

    def observe_inter_token(self, seconds: float, num_tokens: int = 1) -> None:
        """Record the gap before each of `num_tokens` new tokens."""
        child = self.inter_token_latency.labels(self.model_name)
        for _ in range(num_tokens):
            child.observe(seconds)

    def observe_finished(self, reason: str, seconds: float) -> None:
        """Record a request's end and its end-to-end latency."""
        self.request_finished.labels(self.model_name, reason).inc()
        self.e2e_latency.labels(self.model_name).observe(seconds)

    def observe_request(self, output: RequestOutput) -> None:
        """Record a finished request's phases (from the engine's own timestamps) and lengths; a phase it never
        reached (e.g. aborted while waiting) is left out."""
        model = self.model_name
        times = output.metrics
        for histogram, seconds in (
            (self.queue_time, times.queue_time),
            (self.prefill_time, times.prefill_time),
            (self.decode_time, times.decode_time),
            (self.inference_time, times.inference_time),
        ):
            if seconds is not None:
                histogram.labels(model).observe(seconds)
        num_generated = sum(len(o.token_ids) for o in output.outputs)
        longest = max((len(o.token_ids) for o in output.outputs), default=0)
        if times.decode_time is not None and longest > 1:
            self.time_per_output_token.labels(model).observe(times.decode_time / (longest - 1))
        self.prompt_length.labels(model).observe(output.num_prompt_tokens)
        self.generation_length.labels(model).observe(num_generated)

    def observe_error(self, status: int) -> None:
        """Count an error response."""
        self.http_errors.labels(str(status)).inc()

    def set_engine_stats(self, stats: EngineStats) -> None:
        """The stats the next scrape reports (taken on the engine thread)."""
        self._engine.stats = stats

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
