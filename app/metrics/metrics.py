"""Prometheus metrics with vLLM-style names, on a registry owned by one app (no global state).

One process: the engine series carry `model_name`. A replica set (`--replicas N`): they carry `replica` too, one
series per serving replica, beside the set's own (replicas asked, ready, up; routed requests per replica and
outcome: app/metrics/cluster_metrics.py). Latencies are observed in the ingress, for the whole service.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest

from app.metrics.cluster_metrics import ClusterCollector, ReplicaSetReport
from app.metrics.engine_metrics import PREFIX, EngineStatsCollector
from engine.core.outputs import RequestOutput
from engine.core.stats import EngineStats

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


class Metrics:
    """All of one app's metrics. Latencies are observed on the event loop; engine stats are set before a scrape."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._engine = EngineStatsCollector(model_name)
        self.registry.register(self._engine)
        self._cluster = ClusterCollector(model_name)
        self.registry.register(self._cluster)
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
        self._cluster.model_name = model_name

    def for_model(self, model_name: str) -> Metrics:
        """The same series, labelled with another served model (several models: app/http/model_registry.py). Its
        engine gauges come through `set_other_models`."""
        view = copy.copy(self)
        view.model_name = model_name
        return view

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

    def set_other_models(
        self,
        stats: Sequence[tuple[str, str | None, EngineStats]],
        replica_sets: Sequence[tuple[str, ReplicaSetReport]] = (),
    ) -> None:
        """The engine series of the loaded models other than the default: (model, replica or None, stats); and
        the replica set series of those that run as one (`--replicas`): (model, its report)."""
        self._engine.other_models = stats
        self._cluster.others = replica_sets

    def set_replica_set(self, report: ReplicaSetReport) -> None:
        """What the next scrape reports of a replica set: each serving replica's engine series (labelled by
        replica), the replicas' health and the routing decisions."""
        self._engine.replica_stats = report.stats
        self._cluster.report = report

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
