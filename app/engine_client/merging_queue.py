"""A single-consumer queue on the event loop whose newest item absorbs the next one when the two merge.

A consumer that falls behind (a slow reader) then finds a bounded backlog, one merged item plus the few that do not
merge, never one object per token. Request streams merge engine outputs; session replies merge text deltas.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class MergingQueue(Generic[T]):
    """`put` from the event loop, `await get()` from one consumer; `merge(last, new)` returns None to append."""

    def __init__(self, merge: Callable[[T, T], T | None]) -> None:
        self._merge = merge
        self._items: deque[T] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        merged = self._merge(self._items[-1], item) if self._items else None
        if merged is None:
            self._items.append(item)
        else:
            self._items[-1] = merged
        self._ready.set()

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()
