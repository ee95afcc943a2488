"""Batches concurrent embedding requests into forward passes run one at a time in one thread.

A request that finds no forward running starts one at once (on the loop's next turn, so requests
arriving in the same turn, e.g. an `asyncio.gather`, still go together); requests arriving while a
forward runs join the next batch, which starts as soon as that forward ends. No queue, no worker
task: the only hops are the thread's result handed back to the loop and the caller's wake-up (the
queue + worker + run_in_executor chain this replaces cost two more loop turns per request, which
a busy event loop makes expensive). Callers cancelled before their batch starts cost nothing; a
batch whose callers are all gone is skipped.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

Forward = Callable[[Sequence[str]], np.ndarray]


@dataclass
class _Batch:
    texts: list[str] = field(default_factory=list)
    futures: list[asyncio.Future[np.ndarray]] = field(default_factory=list)


def _hand_back(loop: asyncio.AbstractEventLoop, finish: Callable[..., None], *args: object) -> None:
    """From the forward's thread to the loop; a loop closed meanwhile has no caller left to tell."""
    try:
        loop.call_soon_threadsafe(finish, *args)
    except RuntimeError:
        pass


class ForwardBatcher:
    """`await submit(text)` -> the forward's row for `text`. `forward` runs in a dedicated thread;
    `on_result(text, vector)` sees each new vector once (the embedder's LRU)."""

    def __init__(
        self, forward: Forward, max_batch: int, on_result: Callable[[str, np.ndarray], None]
    ) -> None:
        self._forward = forward
        self._max_batch = max(1, max_batch)
        self._on_result = on_result
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[_Batch] = deque()  # the last one still takes joiners until full
        self._running = False
        self.batches = 0  # forward passes run (for tests and metrics)
        self.batched_texts = 0

    async def submit(self, text: str) -> np.ndarray:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A new loop (tests, a restarted server): state of the old one can never complete here.
            self._loop, self._waiting, self._running = loop, deque(), False
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        if not self._waiting or len(self._waiting[-1].texts) >= self._max_batch:
            self._waiting.append(_Batch())
            if not self._running and len(self._waiting) == 1:
                loop.call_soon(self._start_next)
        batch = self._waiting[-1]
        batch.texts.append(text)
        batch.futures.append(fut)
        return await fut

    def _start_next(self) -> None:
        while not self._running and self._waiting:
            batch = self._waiting.popleft()
            live = [(t, f) for t, f in zip(batch.texts, batch.futures, strict=True) if not f.done()]
            if not live:  # every caller went away before it started
                continue
            texts = list(dict.fromkeys(t for t, _ in live))
            self._running = True
            assert self._loop is not None
            done = self._executor.submit(self._forward, texts)
            done.add_done_callback(functools.partial(_hand_back, self._loop, self._finish, live, texts))

    def _finish(
        self, live: list[tuple[str, asyncio.Future[np.ndarray]]], texts: list[str], done: Future[np.ndarray]
    ) -> None:
        self._running = False
        try:
            vecs = done.result()
        except Exception as exc:  # the error belongs to this batch's callers; the next one still runs
            for _, f in live:
                if not f.done():
                    f.set_exception(exc)
        else:
            self.batches += 1
            self.batched_texts += len(texts)
            by_text = {}
            for t, v in zip(texts, vecs, strict=True):
                v = v.copy()  # a row of the batch's array would keep the whole array alive
                self._on_result(t, v)
                by_text[t] = v
            for t, f in live:
                if not f.done():
                    f.set_result(by_text[t])
        self._start_next()

    def close(self) -> None:
        for batch in self._waiting:
            for f in batch.futures:
                f.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False)
