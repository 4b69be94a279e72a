"""A rolling window of what the engine did: pool samples and finished sequences' lengths, for charts and advice."""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.core.stats import EngineStats

DEFAULT_WINDOW_S = 600.0
RATE_WINDOW_S = 60.0  # preemptions per minute and the prefix hit rate look this far back
SPEED_WINDOW_S = (
    2.0  # tokens/s looks this far back (short, so the chart follows bursts), 0 once the engine idles
)


@dataclass(frozen=True)
class TrafficPoint:
    """One sample of the pool and queues, with rates derived from the samples before it."""

    time_s: float
    num_used_blocks: int
    num_cached_blocks: int
    num_free_blocks: int
    num_shared_blocks: int
    num_running: int
    num_waiting: int
    num_preempted: int  # waiting sequences that were preempted at least once
    num_preemptions_total: int
    preemptions_per_min: float
    prefix_hit_rate: float | None  # hit tokens / query tokens over RATE_WINDOW_S; None without queries
    ram_hit_rate: float | None  # ... of them, the hits still in the RAM pool
    disk_hit_rate: float | None  # ... and those loaded from the disk tier
    tokens_per_s: (
        float  # generated tokens per second over SPEED_WINDOW_S; 0 when nothing runs or was generated
    )
    num_tokens_stored: int
    paged_waste_tokens: int  # allocated slots not holding a token (the last block's tail)
    contiguous_waste_tokens: int  # max_model_len reserved per running sequence, minus the tokens stored
    # the first sample after sampling stopped (no admin page listened): charts do not join it to the one before
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        """The point as a JSON object (rates rounded for the wire)."""
        d = asdict(self)
        d["time_s"] = round(self.time_s, 3)
        d["preemptions_per_min"] = round(self.preemptions_per_min, 2)
        d["tokens_per_s"] = round(self.tokens_per_s, 1)
        for key in ("prefix_hit_rate", "ram_hit_rate", "disk_hit_rate"):
            if d[key] is not None:
                d[key] = round(d[key], 4)
        return d


@dataclass(frozen=True)
class _Sample:
    time_s: float
    stats: EngineStats


class TrafficRecorder:
    """Keeps `window_s` seconds of engine samples and of finished sequences' lengths (prompt + output tokens)."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, max_lengths: int = 10_000) -> None:
        if window_s < RATE_WINDOW_S:
            raise ValueError(f"window_s must be at least {RATE_WINDOW_S}, got {window_s}")
        self.window_s = window_s
        self._samples: collections.deque[_Sample] = collections.deque()
        self._points: collections.deque[TrafficPoint] = collections.deque()
        self._lengths: collections.deque[tuple[float, int]] = collections.deque(maxlen=max_lengths)
        self._live: dict[int, int] = {}  # seq_id -> tokens at the last sample, to spot sequences that ended

    # ---- feeding ----------------------------------------------------------------------------------------------
    def observe_sequence(self, num_tokens: int, now: float) -> None:
        """A sequence ended holding `num_tokens` tokens (prompt + generated)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be non-negative, got {num_tokens}")
        self._lengths.append((now, num_tokens))

    def observe_live_sequences(self, sequences: list[dict[str, Any]], now: float) -> list[int]:
        """Diff the live sequences against the last call: those gone are recorded as ended; returns their lengths.

        Sampling sees a sequence's length at the last sample before it ended, so it undercounts by the tokens of
        the final interval, and a sequence that lives less than one interval is missed.
        """
        current = {int(s["seq_id"]): int(s["num_tokens"]) for s in sequences}
        ended = [n for seq_id, n in self._live.items() if seq_id not in current]
        for num_tokens in ended:
            self.observe_sequence(num_tokens, now)
        self._live = current
        return ended

    def observe_stats(
        self, stats: EngineStats, now: float, *, num_preempted: int = 0, resumed: bool = False
    ) -> TrafficPoint:
        """Record one engine sample and return the chart point it makes; `resumed`: sampling stopped before it
        (a gap in time that nobody measured, as opposed to a sample late behind a long engine step)."""
        if self._samples and now < self._samples[-1].time_s:
            raise ValueError(f"samples must come in time order: {now} < {self._samples[-1].time_s}")
        self._samples.append(_Sample(now, stats))
        self._trim(now)
        point = replace(self._point(stats, now, num_preempted), resumed=resumed and len(self._samples) > 1)
        self._points.append(point)
        return point

    # ---- reading ----------------------------------------------------------------------------------------------
    def points(self, since_s: float | None = None) -> list[TrafficPoint]:
        """Chart points in time order, optionally only those at or after `since_s`."""
        return [p for p in self._points if since_s is None or p.time_s >= since_s]

    def sequence_lengths(self) -> list[int]:
        """Lengths of the sequences that ended within the window, oldest first."""
        return [n for _, n in self._lengths]

    def observed_span_s(self, now: float) -> float:
        """How many seconds of samples the window holds."""
        return now - self._samples[0].time_s if self._samples else 0.0

    def preemptions_in_window(self) -> int:
        """Preemptions between the oldest and the newest sample."""
        if not self._samples:
            return 0
        return self._samples[-1].stats.num_preemptions - self._samples[0].stats.num_preemptions

    def peak_running(self) -> int:
        """The most sequences running at once in any sample of the window."""
        return max((s.stats.num_running for s in self._samples), default=0)

    def peak_used_blocks(self) -> int:
        """The most blocks in use (ref >= 1) in any sample of the window."""
        return max((s.stats.num_used_blocks for s in self._samples), default=0)

    # ---- internals --------------------------------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._samples and self._samples[0].time_s < horizon:
            self._samples.popleft()
        while self._points and self._points[0].time_s < horizon:
            self._points.popleft()
        while self._lengths and self._lengths[0][0] < horizon:
            self._lengths.popleft()

    def _since(self, now: float, seconds: float) -> _Sample:
        """The oldest sample no older than `seconds` (the newest one when it is the only one)."""
        for sample in self._samples:
            if sample.time_s >= now - seconds:
                return sample
        return self._samples[-1]

    def _point(self, stats: EngineStats, now: float, num_preempted: int) -> TrafficPoint:
        base = self._since(now, RATE_WINDOW_S)
        span = now - base.time_s
        preemptions = stats.num_preemptions - base.stats.num_preemptions
        queries = stats.prefix_query_tokens - base.stats.prefix_query_tokens
        hits = stats.prefix_hit_tokens - base.stats.prefix_hit_tokens
        disk_hits = stats.disk_hit_tokens - base.stats.disk_hit_tokens
        fast = self._since(now, SPEED_WINDOW_S)
        fast_span = now - fast.time_s
        generated = stats.num_generation_tokens_total - fast.stats.num_generation_tokens_total
        previous = self._samples[-2].stats if len(self._samples) > 1 else stats
        if (
            not stats.num_running
            and stats.num_generation_tokens_total == previous.num_generation_tokens_total
        ):
            generated = 0  # idle now: the window's earlier burst is not a speed anything runs at
        return TrafficPoint(
            time_s=now,
            num_used_blocks=stats.num_used_blocks,
            num_cached_blocks=stats.num_cached_blocks,
            num_free_blocks=stats.num_free_blocks,
            num_shared_blocks=stats.num_shared_blocks,
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            num_preempted=num_preempted,
            num_preemptions_total=stats.num_preemptions,
            preemptions_per_min=preemptions * 60.0 / span if span > 0 else 0.0,
            prefix_hit_rate=hits / queries if queries > 0 else None,
            ram_hit_rate=(hits - disk_hits) / queries if queries > 0 else None,
            disk_hit_rate=disk_hits / queries if queries > 0 else None,
            tokens_per_s=generated / fast_span if fast_span > 0 else 0.0,
            num_tokens_stored=stats.num_tokens_stored,
            paged_waste_tokens=stats.num_slots_allocated - stats.num_tokens_stored,
            contiguous_waste_tokens=stats.num_running * stats.max_model_len - stats.num_tokens_stored,
        )
