"""The SSE stream's shutdown cut (app/http/sse.py `_until_closing`): events pass through untouched until the
service closes; then a stream gets its end wait to finish, after which its source is cancelled where it waits (its
finally blocks run) and the farewell events end it."""

from __future__ import annotations

import asyncio

import pytest

from app.http.shutdown import Flag
from app.http.sse import _until_closing

FAREWELL = [{"data": "bye"}, {"data": "[DONE]"}]


class Source:
    """An event source fed by the test, that records how it ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, str] | None] = asyncio.Queue()
        self.ended: str | None = None

    async def events(self):
        try:
            while (event := await self.queue.get()) is not None:
                yield event
            self.ended = "done"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        finally:
            self.ended = self.ended or "closed"


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_events_pass_through_until_the_source_ends():
    async def main():
        source, closing = Source(), Flag()
        for i in range(3):
            source.queue.put_nowait({"data": str(i)})
        source.queue.put_nowait(None)
        got = [e async for e in _until_closing(source.events(), closing, 1.0, lambda: FAREWELL)]
        return got, source.ended

    got, ended = _run(main())
    assert got == [{"data": "0"}, {"data": "1"}, {"data": "2"}] and ended == "done"


def test_a_stalled_source_is_cut_after_the_end_wait_and_the_farewell_follows():
    async def main():
        source, closing = Source(), Flag()
        source.queue.put_nowait({"data": "first"})
        stream = _until_closing(source.events(), closing, 0.2, lambda: FAREWELL)
        got = [await anext(stream)]
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, closing.set)  # while the stream waits for a second event that never comes
        started = loop.time()
        got += [e async for e in stream]
        return got, source.ended, loop.time() - started

    got, ended, waited = _run(main())
    assert got == [{"data": "first"}, *FAREWELL] and ended == "cancelled"
    assert 0.2 <= waited < 2.0  # the end wait after the flag, not at once, not never


def test_after_closing_a_source_that_keeps_going_streams_until_its_deadline():
    async def main():
        source, closing = Source(), Flag()
        closing.set()
        stream = _until_closing(source.events(), closing, 0.3, lambda: FAREWELL)
        got = []

        async def feed():
            for i in range(100):
                source.queue.put_nowait({"data": str(i)})
                await asyncio.sleep(0.02)

        feeder = asyncio.ensure_future(feed())
        got = [e async for e in stream]
        feeder.cancel()
        return got

    got = _run(main())
    assert got[-2:] == FAREWELL and 3 <= len(got) - 2 < 100  # some events, then the cut


def test_a_source_that_stalls_after_an_event_past_closing_is_still_cut_at_the_deadline():
    """The deadline holds for every wait after closing, not only the one under way when the flag was set."""

    async def main():
        source, closing = Source(), Flag()
        stream = _until_closing(source.events(), closing, 0.3, lambda: FAREWELL)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, closing.set)
        loop.call_later(0.1, source.queue.put_nowait, {"data": "late"})  # after the flag, then nothing more
        started = loop.time()
        got = [e async for e in stream]
        return got, source.ended, loop.time() - started

    got, ended, waited = _run(main())
    assert got == [{"data": "late"}, *FAREWELL] and ended == "cancelled"
    assert 0.3 <= waited < 2.0


def test_the_sources_own_timeout_error_is_not_taken_for_the_cut():
    async def failing():
        yield {"data": "one"}
        raise TimeoutError("upstream timed out")

    async def main():
        return [e async for e in _until_closing(failing(), Flag(), 1.0, lambda: FAREWELL)]

    with pytest.raises(TimeoutError, match="upstream timed out"):
        _run(main())


def test_a_consumer_that_stops_reading_closes_the_source():
    async def main():
        source, closing = Source(), Flag()
        source.queue.put_nowait({"data": "only"})
        stream = _until_closing(source.events(), closing, 1.0, lambda: FAREWELL)
        assert await anext(stream) == {"data": "only"}
        await stream.aclose()  # the response ended (a stalled reader was cut off) at the yield
        await asyncio.sleep(0)  # the source's aclose runs as its own task
        await asyncio.sleep(0)
        return source.ended

    assert _run(main()) == "closed"
