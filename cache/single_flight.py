"""Single flight in one process: identical concurrent requests share one generation, unary or
streamed. The one mechanism for both (transformers_svc/answer_pipeline.py drives a unary request
as a generation of one piece); across replicas the pipeline adds the lease of cache/lease.py.

The first request of a key starts the source stream in a task of its own; every request of that key
(the first included) listens to it from its start, so a follower that arrives after some items gets
them at once and then the rest as they come. The generation lives as long as anybody listens: a
listener that leaves does not stop it for the others, and the last one to leave cancels it (the
predictor aborts). If the source fails, every listener gets its exception (the same request would
most likely fail the same way; the client may retry).

Read-your-writes: a generation's last item (or the end of a source that never sends one) is first
handed to `on_complete` (the store, then the lease's release), and only then given to the
listeners: no listener can send its final response before the answer is stored, and requests
arriving meanwhile still join this generation rather than miss.
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
        self._completing = False  # on_complete runs: nobody may cancel it by leaving
        self._changed = asyncio.Event()
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            last: T | None = None
            async for item in self._source:
                if self._is_last(item):
                    last = item
                    break
                self.items.append(item)
                self._notify()
            await self._complete(last)
            # The source may take a moment more to close behind its last item (a gRPC stream's
            # end); nobody waits for that.
        except asyncio.CancelledError:
            self.error = self.error or asyncio.CancelledError()
            raise
        except Exception as exc:
            self.error = exc
        finally:
            self._notify()
            self._on_end()
            with contextlib.suppress(Exception):
                await self._source.aclose()  # type: ignore[attr-defined]

    async def _complete(self, last: T | None) -> None:
        """Hand the whole generation to on_complete, then publish its last item."""
        whole = [*self.items, last] if last is not None else list(self.items)
        self._completing = True
        with contextlib.suppress(Exception):  # the store fails open; the answer is served
            await self._on_complete(whole)
        if last is not None:
            self.items.append(last)
        self.done = True
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def listen(self) -> AsyncIterator[T]:
        """The stream from its start. The listener counts from this call, not from its first read:
        a listener that has not read yet keeps the generation alive for itself."""
        self.listeners += 1
        return self._listen()

    def abandon(self) -> None:
        """Stop a generation nobody listens to (e.g. a speculation its lookup did not need); one
        with listeners, or whose answer is being completed, runs on."""
        if self.listeners == 0 and not self.done and not self._completing:
            self._task.cancel()

    async def _listen(self) -> AsyncIterator[T]:
        seen = 0
        try:
            while True:
                while seen < len(self.items):
                    seen += 1
                    yield self.items[seen - 1]
                if self.done:
                    return
                if self.error is not None:
                    raise self.error
                await self._changed.wait()
        finally:
            self.listeners -= 1
            if self.listeners == 0 and not self.done and not self._completing:
                # Nobody is left to read it: stop the generation (the predictor aborts).
                self._task.cancel()


class SingleFlight(Generic[T]):
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
        broadcast = self.start(key, start, on_complete, is_last)
        return broadcast.listen(), True

    def running(self, key: str) -> bool:
        """Whether a generation of `key` runs that a request could join."""
        broadcast = self._running.get(key)
        return broadcast is not None and broadcast.error is None

    def start(
        self,
        key: str,
        start: Callable[[], AsyncIterator[T]],
        on_complete: Callable[[list[T]], Awaitable[None]],
        is_last: Callable[[T], bool] = lambda _: False,
    ) -> Broadcast[T]:
        """Start a generation of `key` with nobody listening yet (its starter listens, or abandons
        it, once it knows whether it needs it); requests of `key` meanwhile join it."""
        self.started += 1
        broadcast = Broadcast(start(), on_complete, lambda: self._forget(key, broadcast), is_last)
        self._running[key] = broadcast
        return broadcast

    def abandon(self, key: str, broadcast: Broadcast[T]) -> None:
        """Give up a generation started with `start`: it stops unless somebody listens to it, and
        no request joins it from now on."""
        broadcast.abandon()
        if broadcast.listeners == 0:
            self._forget(key, broadcast)

    def _forget(self, key: str, broadcast: Broadcast[T]) -> None:
        if self._running.get(key) is broadcast:
            del self._running[key]

    def __len__(self) -> int:
        return len(self._running)
