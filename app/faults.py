"""Test-only fault injection, off by default: requests whose prompt holds a marker fail at the marked site.

`PAGEDCHAT_FAULT_INJECTION` (Settings.fault_injection) is a comma-separated list of options:
  markers          a request whose prompt text contains `[[fault:SITE]]` fails at SITE, one of
                   detokenize (its incremental detokenization), stop (its stop-string handling, when a stop string
                   matches), deliver (the bridge handing its output to its stream), step (the batched model step
                   that computes it: every request of that step fails), die (the engine thread itself dies)
  step_delay_ms=N  every engine step sleeps N ms first (a slow engine, for shutdown and timeout tests)
The plan wraps the methods of one engine instance; nothing global is patched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
SITES = ("detokenize", "stop", "deliver", "step", "die")


def marker(site: str) -> str:
    """The text that makes a request fail at `site` when markers are enabled."""
    if site not in SITES:
        raise ValueError(f"fault site must be one of {', '.join(SITES)}, got {site!r}")
    return f"[[fault:{site}]]"


class InjectedFault(RuntimeError):
    """The exception an injected fault raises."""


@dataclass
class FaultPlan:
    """Which faults to inject; `injected` counts the faults raised per site (read it from any thread)."""

    markers: bool = False
    step_delay_s: float = 0.0
    injected: Counter[str] = field(default_factory=Counter)
    _marked: dict[str, str] = field(default_factory=dict)  # request id -> site
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def parse(cls, spec: str) -> FaultPlan | None:
        """The plan a PAGEDCHAT_FAULT_INJECTION value describes; None when it is empty (the default)."""
        plan = cls()
        for option in (o.strip() for o in spec.split(",")):
            if not option:
                continue
            name, _, value = option.partition("=")
            if name == "markers" and not value:
                plan.markers = True
            elif name == "step_delay_ms" and value.isdigit():
                plan.step_delay_s = int(value) / 1000
            else:
                raise ValueError(
                    f"PAGEDCHAT_FAULT_INJECTION: unknown option {option!r}; expected 'markers' or 'step_delay_ms=N'"
                )
        return plan if plan.markers or plan.step_delay_s else None

    def site_of(self, request_id: str) -> str | None:
        """The fault site a live request is marked for, if any."""
        return self._marked.get(request_id)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's mark (its fault never fired, e.g. no stop string matched)."""
        self._marked.pop(request_id, None)

    def fire(self, site: str, request_id: str) -> None:
        """Raise InjectedFault if `request_id` is marked for `site` (each request's fault fires once)."""
        if self._marked.get(request_id) != site:
            return
        with self._lock:
            if self._marked.pop(request_id, None) is None:
                return
            self.injected[site] += 1
        logger.warning("injecting a %s fault into request %s", site, request_id)
        raise InjectedFault(f"injected {site} fault")

    def install(self, engine: LLMEngine) -> None:
        """Wrap this engine instance's methods at the fault sites (the deliver site lives in the bridge)."""
        if self.step_delay_s:
            _wrap(engine, "step", self._delayed)
        if not self.markers:
            return
        _wrap(engine, "add_request", self._marking(engine))
        _wrap(engine.output_processor, "_detokenize", self._detokenize)
        _wrap(engine.scheduler, "finish", self._finish)
        _wrap(engine.runner, "execute", self._execute)
        _wrap(engine, "has_unfinished_requests", self._alive_check)

    # ---- the wrappers (each gets the original bound method first) ---------------------------------------------
    def _delayed(self, original: Any) -> list[Any]:
        time.sleep(self.step_delay_s)
        return original()

    def _marking(self, engine: LLMEngine) -> Any:
        def add_request(original: Any, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> None:
            original(request_id, prompt, params, **kwargs)
            text = prompt if isinstance(prompt, str) else engine.tokenizer.decode(prompt)
            site = next((s for s in SITES if marker(s) in text), None)
            if site is not None:
                self._marked[request_id] = site

        return add_request

    def _detokenize(self, original: Any, state: Any, sample: Any) -> None:
        self.fire("detokenize", state.request_id)
        original(state, sample)

    def _finish(self, original: Any, seq: Any, reason: Any, stop_reason: Any = None) -> None:
        if isinstance(stop_reason, str):  # a matched stop string, as opposed to EOS / max_tokens / abort
            self.fire("stop", seq.request_id)
        original(seq, reason, stop_reason)

    def _execute(self, original: Any, out: Any) -> Any:
        for item in out.scheduled:
            self.fire("step", item.seq.request_id)
        return original(out)

    def _alive_check(self, original: Any) -> bool:
        victim = next((rid for rid, site in self._marked.items() if site == "die"), None)
        if victim is not None:
            self.fire("die", victim)
        return original()


def _wrap(owner: Any, name: str, wrapper: Any) -> None:
    """Shadow `owner.name` with an instance attribute calling `wrapper(original, *args)`."""
    original = getattr(owner, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(owner, name, call)
