"""Speculative decoding in tests: a planner that proposes whatever it may, whatever the machine's load."""

from __future__ import annotations

from engine import LLM
from engine.core.speculative import StepTimes


class FlatTimes(StepTimes):
    """Step times by which extra rows (and a draft model's measured rounds, a few ms against a second) cost next to
    nothing: the planner then verifies every token it may propose. Without it, what the planner proposes follows the
    measured step times, and so the machine's load (a test that needs proposals would then depend on it)."""

    def __init__(self) -> None:
        super().__init__({1: 1.0})

    def add(self, rows: int, seconds: float) -> None:
        pass

    def estimate(self, rows: int) -> float:
        return 1.0


def propose_always(llm: LLM) -> LLM:
    """The engine's planner with flat step times (see FlatTimes); returns `llm`."""
    assert llm.engine.spec is not None, "speculative_method is off"
    llm.engine.spec.step_times = FlatTimes()
    return llm
