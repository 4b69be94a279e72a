"""Prometheus metrics with vLLM-style names, on a registry owned by one app (no global state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
        yield counter(
            "num_preemptions",
            "Sequences preempted (recomputed later) for lack of KV blocks.",
            stats.num_preemptions,
        )
        yield counter("prompt_tokens", "Prompt tokens computed (prefill).", stats.num_prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated.", stats.num_generation_tokens_total)
        yield counter("engine_steps", "Engine steps run.", stats.num_steps)


class Metrics:
    """All of one app's metrics. Latencies are observed on the event loop; engine stats are set before a scrape."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._engine = _EngineStatsCollector(model_name)
        self.registry.register(self._engine)
        self.time_to_first_token = self._latency(
            "time_to_first_token_seconds", "Time from submission to the first token.", TTFT_BUCKETS
        )
        self.inter_token_latency = self._latency(
            "inter_token_latency_seconds", "Time between consecutive tokens of a request.", ITL_BUCKETS
        )
        self.e2e_latency = self._latency(
            "e2e_request_latency_seconds", "Time from submission to the request's end.", E2E_BUCKETS
        )
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

    def _latency(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
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

    def observe_error(self, status: int) -> None:
        """Count an error response."""
        self.http_errors.labels(str(status)).inc()

    def set_engine_stats(self, stats: EngineStats) -> None:
        """The stats the next scrape reports (taken on the engine thread)."""
        self._engine.stats = stats

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
