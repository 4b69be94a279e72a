"""The step loop (app/engine_client/step_loop.py) with stand-in engines: engines step in turn on one thread, an engine
that closes slowly (or fails to) holds no other, and a dead thread answers everyone, then a new one starts."""

from __future__ import annotations

import threading
import time
from typing import Any

from app.engine_client.step_loop import StepLoop


class FakeEngine:
    """Steps while it has work (`work` steps left), recording on which thread and when."""

    def __init__(
        self, name: str, log: list[tuple[str, str]], *, close_s: float = 0.0, close_error: bool = False
    ):
        self.name, self.log, self.work = name, log, 0
        self.close_s, self.close_error, self.closed = close_s, close_error, threading.Event()
        self.step_times: list[float] = []
        self.explode: BaseException | None = None

    def has_unfinished_requests(self) -> bool:
        return self.work > 0

    def step(self) -> list[Any]:
        if self.explode is not None:
            raise self.explode
        self.work -= 1
        self.step_times.append(time.monotonic())
        self.log.append((self.name, threading.current_thread().name))
        time.sleep(0.002)
        return []

    def abort_request(self, request_id: str) -> None:
        pass

    def close(self, timeout: float) -> None:
        time.sleep(self.close_s)
        if self.close_error:
            raise OSError("the disk is full")
        self.closed.set()


class FakeHost:
    """A client: its commands give its engine work; it records what the loop tells it."""

    drain_s = 1.0

    def __init__(self) -> None:
        self.stopped_event = threading.Event()
        self.died: list[str] = []
        self.rejected: list[Any] = []

    def run_command(self, engine: FakeEngine, command: Any, live: set[str]) -> None:
        engine.work += command

    def deliver(self, outputs: list[Any]) -> None:
        pass

    def step_failed(self, request_ids: list[str], exc: Exception) -> None:
        pass

    def stopped(self) -> None:
        self.stopped_event.set()

    def thread_died(self, reason: str) -> None:
        self.died.append(reason)

    def reject(self, command: Any) -> None:
        self.rejected.append(command)


def _wait(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_engines_step_in_turn_on_one_thread_which_ends_with_the_last():
    log: list[tuple[str, str]] = []
    loop = StepLoop("steps")
    (a, b), (ha, hb) = (FakeEngine("a", log), FakeEngine("b", log)), (FakeHost(), FakeHost())
    loop.attach(ha, a)
    loop.attach(hb, b)
    loop.put(ha, 5)
    loop.put(hb, 5)
    _wait(lambda: len(log) == 10)
    assert {thread for _, thread in log} == {"steps"}
    order = "".join(name for name, _ in log)
    assert "aa" not in order[1:9] and "bb" not in order[1:9]  # in turn, once the second has its work
    loop.detach(ha)
    loop.detach(hb)
    assert ha.stopped_event.wait(5) and hb.stopped_event.wait(5)
    loop.join(5)
    assert loop._thread is None
    loop.put(ha, 1)  # after the engine left: nothing runs it, and a new thread is not started for it
    assert loop._thread is None


def test_an_engine_that_closes_slowly_or_fails_to_holds_no_other():
    log: list[tuple[str, str]] = []
    loop = StepLoop()
    slow, other = FakeEngine("slow", log, close_s=1.0, close_error=True), FakeEngine("other", log)
    hs, ho = FakeHost(), FakeHost()
    loop.attach(hs, slow)
    loop.attach(ho, other)
    loop.detach(hs)  # closing takes a second, then fails
    time.sleep(0.05)
    started = time.monotonic()
    loop.put(ho, 20)
    _wait(lambda: len(other.step_times) == 20)
    assert other.step_times[-1] - started < 0.8  # stepped while the other engine was closing
    assert hs.stopped_event.wait(5)  # told it stopped, though its close failed
    assert not slow.closed.is_set() and not ho.died
    loop.put(ho, 3)
    _wait(lambda: len(other.step_times) == 23)
    loop.detach(ho)
    assert ho.stopped_event.wait(5)


def test_a_dead_thread_tells_every_engine_and_a_later_attach_starts_a_new_one():
    log: list[tuple[str, str]] = []
    loop = StepLoop()
    a, b = FakeEngine("a", log), FakeEngine("b", log)
    ha, hb = FakeHost(), FakeHost()
    loop.attach(ha, a)
    loop.attach(hb, b)
    a.explode = SystemExit("injected")
    loop.put(ha, 1)
    _wait(lambda: ha.died and hb.died)
    assert ha.died == hb.died == ["engine thread died: SystemExit: injected"]
    loop.put(hb, 1)  # raced the death: answered by whichever thread takes it, never left hanging
    c, hc = FakeEngine("c", log), FakeHost()
    loop.attach(hc, c)
    loop.put(hc, 2)
    _wait(lambda: len(c.step_times) == 2)
    _wait(lambda: hb.rejected == [1])
    loop.detach(hc)
    assert hc.stopped_event.wait(5)
