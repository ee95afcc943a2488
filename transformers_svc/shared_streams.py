"""Single flight for streaming misses: identical concurrent requests share one generation.

The first request of a key starts the predictor's stream in a task of its own; every request of
that key (the first included) listens to it from its start, so a follower that arrives after some
pieces gets them at once and then the rest as they come. The generation lives as long as anybody
listens: a listener that leaves does not stop it for the others, and the last one to leave cancels
it (the predictor aborts). A generation that ends cleanly is handed to `on_complete` (the store)
before it leaves the registry, so requests arriving in between still share it rather than miss.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Broadcast(Generic[T]):
    """One source stream, replayed from its start to every listener."""

    def __init__(
        self,
        source: AsyncIterator[T],
        on_complete: Callable[[list[T]], Awaitable[None]],
        on_end: Callable[[], None],
        is_last: Callable[[T], bool] = lambda _: False,
    ) -> None:
        self.items: list[T] = []
        self.done = False
        self.error: BaseException | None = None
        self.listeners = 0
        self._source = source
        self._on_complete = on_complete
        self._on_end = on_end
        self._is_last = is_last
        self._changed = asyncio.Event()
        self._settled = asyncio.Event()  # the source has closed and on_complete has run (or failed)
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            async for item in self._source:
                self.items.append(item)
                # Done at its last item, not when the source has closed behind it: a listener that
                # leaves once it has everything must not cancel (and so abort) the generation.
                self.done = self.done or self._is_last(item)
                self._notify()
            self.done = True
            self._notify()
            with contextlib.suppress(Exception):  # the store fails open; the answer is served
                await self._on_complete(self.items)
        except asyncio.CancelledError:
            self.error = self.error or asyncio.CancelledError()
            raise
        except Exception as exc:
            self.error = exc
        finally:
            with contextlib.suppress(Exception):
                await self._source.aclose()  # type: ignore[attr-defined]
            self._settled.set()
            self._notify()
            self._on_end()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def listen(self) -> AsyncIterator[T]:
        self.listeners += 1
        seen = 0
        try:
            while True:
                while seen < len(self.items):
                    seen += 1
                    yield self.items[seen - 1]
                if self.done:
                    # The end once the answer is stored: a request that follows this one then
                    # finds it in the cache.
                    await self._settled.wait()
                    return
                if self.error is not None:
                    raise self.error
                await self._changed.wait()
        finally:
            self.listeners -= 1
            if self.listeners == 0 and not self.done:
                # Nobody is left to read it: stop the generation (the predictor aborts).
                self._task.cancel()


class SharedStreams(Generic[T]):
    """Broadcasts by key, for as long as their generation runs."""

    def __init__(self) -> None:
        self._running: dict[str, Broadcast[T]] = {}
        self.started = 0
        self.joined = 0

    def listen(
        self,
        key: str,
        start: Callable[[], AsyncIterator[T]],
        on_complete: Callable[[list[T]], Awaitable[None]],
        is_last: Callable[[T], bool] = lambda _: False,
    ) -> tuple[AsyncIterator[T], bool]:
        """The stream of `key` from its start, and whether this call started it. `is_last` says
        which item ends the stream (the source may take a moment more to close)."""
        broadcast = self._running.get(key)
        if broadcast is not None and broadcast.error is None:
            self.joined += 1
            return broadcast.listen(), False
        self.started += 1
        broadcast = Broadcast(start(), on_complete, lambda: self._forget(key, broadcast), is_last)
        self._running[key] = broadcast
        return broadcast.listen(), True

    def _forget(self, key: str, broadcast: Broadcast[T]) -> None:
        if self._running.get(key) is broadcast:
            del self._running[key]

    def __len__(self) -> int:
        return len(self._running)
