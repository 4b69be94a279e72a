"""Where a served decode step's time goes: its linears (matmuls), attention, and the rest (EngineConfig.step_timing).

A `StepClock` wraps every linear module's forward and the attention backend's forward with a timer (~0.2 µs
each; a linear's share includes its own Python call); the fused decode step times its own linears and attention
(KV store included) inside C. The engine reads the clock around each decode-only step and keeps totals per batch
size (`StepTimings`), so the split can be read off a running server (`/api/admin/state`, `/metrics`) under real
traffic, not only in an offline loop (`pagedchat bench step`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.core.stats import StepTiming
from engine.models.quantized import linear_modules


class Clock:
    """Seconds spent inside wrapped callables since the last reset."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


class StepClock:
    """The linears' and attention's seconds of one step, read after it; see the module docstring."""

    def __init__(self, runner: Any) -> None:
        self.matmul, self.attention = Clock(), Clock()
        linears = linear_modules(runner.model)
        for module in linears:
            module.forward = self.matmul.wrap(module.forward)
        # weights the timed linears multiply per sequence and step (their rate: 2 operations a weight)
        self.linear_weights = sum(m.in_features * m.out_features for m in linears)
        runner.backend.forward = self.attention.wrap(runner.backend.forward)
        # the fused C step's own clocks: [linears, attention]
        self._fused = runner.fused.seconds if runner.fused is not None else None

    def reset(self) -> None:
        self.matmul.seconds = self.attention.seconds = 0.0
        if self._fused is not None:
            self._fused[0] = self._fused[1] = 0.0

    def read(self) -> tuple[float, float]:
        """(matmul seconds, attention seconds) since the last reset."""
        inside = self._fused if self._fused is not None else (0.0, 0.0)
        return self.matmul.seconds + inside[0], self.attention.seconds + inside[1]


class StepTimings:
    """Totals of timed decode-only steps per batch size (sequences in the step), since the engine started."""

    def __init__(self) -> None:
        self._totals: dict[int, list[float]] = {}  # batch size -> [steps, step s, matmul s, attention s]

    def add(self, batch_size: int, step_s: float, matmul_s: float, attention_s: float) -> None:
        row = self._totals.setdefault(batch_size, [0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += step_s
        row[2] += matmul_s
        row[3] += attention_s

    def snapshot(self) -> tuple[StepTiming, ...]:
        return tuple(
            StepTiming(batch_size=b, num_steps=int(n), step_s=s, matmul_s=m, attention_s=a)
            for b, (n, s, m, a) in sorted(self._totals.items())
        )
