"""One thread that steps every engine of this process in turn.

Two engines stepping on two threads of a 2-core machine stall each other: each step's kernels start a team of
threads that spin while they wait, and two teams at once make both several times slower. So the engines of one
process (several models, `app/models/`) share this loop: it runs each busy engine's step in turn, between them the
commands the event loop sent (add, abort, calls), and blocks while no engine has work. One engine is the case of
one model: its own loop, the same code.

The thread starts when the first engine attaches and ends when the last one has stopped; an engine is built
elsewhere (its loader's thread, `AsyncEngine.start`) and attaches ready to step, so loading a model never holds
the others' steps.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from engine.core.outputs import RequestOutput
    from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


class Host(Protocol):
    """What the loop needs of an engine's client (`AsyncEngine`): it runs the client's commands on its engine, and
    tells it of outputs, failures and the thread's death; each of these returns at once (they hand over to the
    client's event loop)."""

    drain_s: float

    def run_command(self, engine: LLMEngine, command: Any, live: set[str]) -> None: ...

    def deliver(self, outputs: list[RequestOutput]) -> None: ...

    def step_failed(self, request_ids: list[str], exc: Exception) -> None: ...

    def stopped(self) -> None: ...

    def thread_died(self, reason: str) -> None: ...

    def reject(self, command: Any) -> None: ...


@dataclass
class _Attach:
    engine: LLMEngine


@dataclass
class _Stop:
    pass


@dataclass
class _Hosted:
    engine: LLMEngine
    live: set[str] = field(default_factory=set)  # request ids the engine holds for this client


class StepLoop:
    """The step thread of one process. `attach` an engine, `put` its client's commands, `detach` it to stop."""

    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self._inbox: queue.SimpleQueue[tuple[Host, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the thread's start and end, against `attach`
        self._thread: threading.Thread | None = None

    def attach(self, host: Host, engine: LLMEngine) -> None:
        """Hand `engine` (built, warmed up) to the loop: `host`'s commands run on it from now on."""
        with self._lock:
            self._inbox.put((host, _Attach(engine)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
                self._thread.start()

    def put(self, host: Host, command: Any) -> None:
        """A command for `host`'s engine, run between steps in the order given."""
        self._inbox.put((host, command))

    def detach(self, host: Host) -> None:
        """Drop `host`'s engine from the loop, then abort its requests and close it (its disk tier writes what it
        queued) on a thread of its own; `host.stopped` is called once done."""
        self._inbox.put((host, _Stop()))

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (after the last engine is detached)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # ---- the thread -----------------------------------------------------------------------------------------
    def _main(self) -> None:
        hosts: dict[Host, _Hosted] = {}
        try:
            self._serve(hosts)
        except BaseException as exc:  # noqa: BLE001 - the thread must report its death, never vanish
            logger.critical("engine thread died: %s: %s", type(exc).__name__, exc, exc_info=True)
            reason = f"engine thread died: {type(exc).__name__}: {exc}"
            with self._lock:  # what raced the death is taken before an `attach` may start the next thread
                pending = []
                while True:
                    try:
                        pending.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                self._thread = None
            for host in hosts:
                host.thread_died(reason)
            for host, command in pending:  # answered, never left hanging
                if isinstance(command, _Attach):
                    host.thread_died(reason)
                else:
                    self._refuse(host, command)

    @staticmethod
    def _refuse(host: Host, command: Any) -> None:
        """A command for an engine the loop does not hold (stopped, never attached, or the thread died)."""
        if isinstance(command, _Stop):
            host.stopped()
        else:
            host.reject(command)

    def _serve(self, hosts: dict[Host, _Hosted]) -> None:
        while True:
            busy = any(h.engine.has_unfinished_requests() for h in hosts.values())
            if not self._take_commands(hosts, block=not busy):
                return
            for host in list(hosts):  # each busy engine steps once a round, commands taken between steps
                hosted = hosts.get(host)
                if hosted is not None and hosted.engine.has_unfinished_requests():
                    self._step(host, hosted)
                if not self._take_commands(hosts, block=False):
                    return

    def _take_commands(self, hosts: dict[Host, _Hosted], *, block: bool) -> bool:
        """Run the commands waiting (the first awaited when `block`); False once no engine is left to serve."""
        while True:
            try:
                host, command = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(command, _Attach):
                hosts[host] = _Hosted(command.engine)
                continue
            hosted = hosts.get(host)
            if hosted is None:
                # the engine has stopped (or never attached): its commands are answered, not run
                self._refuse(host, command)
                continue
            if isinstance(command, _Stop):
                # closed on a thread of its own: its disk tier may take seconds to write what it queued, and the
                # other engines keep stepping meanwhile
                del hosts[host]
                closing = threading.Thread(
                    target=self._close, args=(host, hosted), name=f"{self.name}-close", daemon=True
                )
                closing.start()
                if not hosts:
                    with self._lock:  # the last engine has gone: end the thread unless one is attaching
                        if self._inbox.empty():
                            self._thread = None
                            return False
                continue
            host.run_command(hosted.engine, command, hosted.live)

    @staticmethod
    def _close(host: Host, hosted: _Hosted) -> None:
        """Abort what the engine still holds, close it, and tell its client; a failure is this engine's alone."""
        try:
            for request_id in list(hosted.live):
                hosted.engine.abort_request(request_id)
            hosted.engine.close(host.drain_s)
        except Exception:
            logger.exception("closing an engine failed")
        finally:
            host.stopped()

    @staticmethod
    def _step(host: Host, hosted: _Hosted) -> None:
        try:
            outputs = hosted.engine.step()
        except Exception as exc:  # the engine fails a step's requests itself; this is the last resort
            logger.exception("engine.step() raised; failing %d in-flight requests", len(hosted.live))
            for request_id in hosted.live:
                hosted.engine.abort_request(request_id)
            host.step_failed(list(hosted.live), exc)
            hosted.live.clear()
            return
        for output in outputs:
            if output.finished:
                hosted.live.discard(output.request_id)
        if outputs:
            host.deliver(outputs)
