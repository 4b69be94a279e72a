"""Fault injection for tests: an engine wrapper whose requests fail at the site their prompt marks.

The product has no fault code. Tests hand `create_app(settings, engine_factory=...)` a factory whose engine is a
`FaultyEngine` (in-process: `make_client(faults=...)`; a server process: `python -m tests.fault_server`).
A `FaultPlan` says what to inject:
  markers       a request whose prompt text contains `[[fault:SITE]]` fails at SITE, one of
                detokenize (its incremental detokenization), stop (its stop-string handling, when a stop string
                matches), deliver (the bridge handing its output to its stream), step (the batched model step that
                computes it: every request of that step fails), die (the engine thread itself dies)
  step_delay_s  every engine step sleeps this long first (a slow engine, for shutdown and timeout tests)
  load_delay_s  every engine's build sleeps this long first (a slow model load, for several models' tests)
Only the one wrapped engine instance changes; nothing global is patched.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.core.outputs import CompletionOutput, RequestOutput

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
SITES = ("detokenize", "stop", "deliver", "step", "die")
# a server process reads its plan here (FaultPlan.parse); tests/e2e/conftest.start_server runs such a server
# under tests/fault_server.py instead of the product's `pagedchat serve`
FAULTS_ENV = "PAGEDCHAT_TEST_FAULTS"


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
    load_delay_s: float = 0.0  # every engine takes this much longer to build (a slow model load)
    injected: Counter[str] = field(default_factory=Counter)
    # request id -> site; only the engine thread touches it
    _marked: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        """The plan a FAULTS_ENV value describes: comma-separated `markers`, `step_delay_ms=N` and `load_delay_ms=N`."""
        plan = cls()
        for option in (o.strip() for o in spec.split(",")):
            if not option:
                continue
            name, _, value = option.partition("=")
            if name == "markers" and not value:
                plan.markers = True
            elif name == "step_delay_ms" and value.isdigit():
                plan.step_delay_s = int(value) / 1000
            elif name == "load_delay_ms" and value.isdigit():
                plan.load_delay_s = int(value) / 1000
            else:
                raise ValueError(
                    f"{FAULTS_ENV}: unknown option {option!r}; expected 'markers', 'step_delay_ms=N' or "
                    "'load_delay_ms=N'"
                )
        return plan

    def mark(self, request_id: str, text: str) -> None:
        """Remember the site a new request's prompt text marks, if any."""
        site = next((s for s in SITES if marker(s) in text), None)
        if site is not None:
            self._marked[request_id] = site

    def take(self, site: str, request_id: str) -> bool:
        """True (once) when `request_id` is marked for `site`; the mark is used up."""
        if self._marked.get(request_id) != site:
            return False
        del self._marked[request_id]
        return True

    def marked_for(self, site: str) -> str | None:
        """A live request marked for `site`, if any."""
        return next((rid for rid, marked in self._marked.items() if marked == site), None)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's mark (its fault never fired, e.g. no stop string matched)."""
        self._marked.pop(request_id, None)

    def raise_fault(self, site: str, request_id: str) -> None:
        """Count and raise the fault of `site`."""
        with self._lock:
            self.injected[site] += 1
        logger.warning("injecting a %s fault into request %s", site, request_id)
        raise InjectedFault(f"injected {site} fault")

    def fire(self, site: str, request_id: str) -> None:
        """Raise InjectedFault if `request_id` is marked for `site` (each request's fault fires once)."""
        if self.take(site, request_id):
            self.raise_fault(site, request_id)


def faulty_engine_factory(factory: Callable[[], LLMEngine], plan: FaultPlan) -> Callable[[], FaultyEngine]:
    """An engine factory for `create_app` whose engines inject the plan's faults (and build `load_delay_s` late)."""

    def build() -> FaultyEngine:
        time.sleep(plan.load_delay_s)
        return FaultyEngine(factory(), plan)

    return build


class FaultyEngine:
    """An LLMEngine with a plan's faults. The bridge calls this wrapper; the sites inside a step (detokenization,
    stop handling, the model run) are wrapped on the engine instance, so the engine's own error handling sees them.
    """

    def __init__(self, engine: LLMEngine, plan: FaultPlan) -> None:
        self.engine = engine
        self.plan = plan
        if plan.markers:
            _wrap(engine.output_processor, "_detokenize", self._detokenize)
            _wrap(engine.scheduler, "finish", self._finish)
            _wrap(engine.runner, "execute", self._execute)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)  # config, tokenizer, abort_request, stats, snapshot, ...

    def add_request(self, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> None:
        self.engine.add_request(request_id, prompt, params, **kwargs)
        if self.plan.markers:
            text = prompt if isinstance(prompt, str) else self.engine.tokenizer.decode(prompt)
            self.plan.mark(request_id, text)

    def has_unfinished_requests(self) -> bool:
        victim = self.plan.marked_for("die")
        if victim is not None:
            self.plan.fire("die", victim)
        return self.engine.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        if self.plan.step_delay_s:
            time.sleep(self.plan.step_delay_s)
        outputs = self.engine.step()
        if not self.plan.markers:
            return outputs
        delivered = []
        for output in outputs:
            if self.plan.take("deliver", output.request_id):
                output = _Undeliverable.of(output, self.plan)
            elif output.finished:
                self.plan.forget(output.request_id)
            delivered.append(output)
        return delivered

    # ---- the sites inside a step (each wrapper gets the original bound method first) --------------------------
    def _detokenize(self, original: Any, state: Any, sample: Any) -> None:
        self.plan.fire("detokenize", state.request_id)
        original(state, sample)

    def _finish(self, original: Any, seq: Any, reason: Any, stop_reason: Any = None) -> None:
        if isinstance(stop_reason, str):  # a matched stop string, as opposed to EOS / max_tokens / abort
            self.plan.fire("stop", seq.request_id)
        original(seq, reason, stop_reason)

    def _execute(self, original: Any, out: Any) -> Any:
        for item in out.scheduled:
            self.plan.fire("step", item.seq.request_id)
        return original(out)


class _Undeliverable(RequestOutput):
    """An output whose samples raise InjectedFault the first time they are read. The bridge reads them as it hands
    the output to its request's stream (for the token latency metrics), so delivering this output fails there."""

    _raise: Callable[[], None] | None = None
    _samples: list[CompletionOutput]

    @classmethod
    def of(cls, output: RequestOutput, plan: FaultPlan) -> _Undeliverable:
        copy = cls(**{f.name: getattr(output, f.name) for f in dataclasses.fields(output)})
        copy._raise = lambda: plan.raise_fault("deliver", output.request_id)
        return copy

    @property  # type: ignore[override]
    def outputs(self) -> list[CompletionOutput]:
        fault, self._raise = self._raise, None
        if fault is not None:
            fault()
        return self._samples

    @outputs.setter
    def outputs(self, value: list[CompletionOutput]) -> None:
        self._samples = value


def _wrap(owner: Any, name: str, wrapper: Any) -> None:
    """Shadow `owner.name` with an instance attribute calling `wrapper(original, *args)`."""
    original = getattr(owner, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(owner, name, call)
