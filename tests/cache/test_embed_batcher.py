"""cache/embed_batcher.py with a stand-in forward (a real thread, no model): who goes in which batch,
cancelled callers, errors; and on the lookup path with the real embedder and Redis."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from cache.embed_batcher import ForwardBatcher
from cache.entry_store import EntryStore
from cache.settings import CacheSettings


class GatedForward:
    """Rows [len(text), i] per text; blocks until `gate` is set, so a test can pile requests up
    behind a running forward."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.calls: list[list[str]] = []
        self.fail_next = False

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.started.set()
        self.gate.wait(5)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("forward failed")
        return np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)


@pytest.fixture
def forward() -> GatedForward:
    return GatedForward()


async def test_a_lone_request_runs_alone_and_results_reach_on_result(forward: GatedForward) -> None:
    seen: list[str] = []
    b = ForwardBatcher(forward, max_batch=8, on_result=lambda t, v: seen.append(t))
    try:
        vec = await b.submit("abc")
        assert vec.tolist() == [3.0, 0.0]
        assert forward.calls == [["abc"]] and seen == ["abc"]
        assert (b.batches, b.batched_texts) == (1, 1)
    finally:
        b.close()


async def test_requests_during_a_forward_join_the_next_batch(forward: GatedForward) -> None:
    b = ForwardBatcher(forward, max_batch=8, on_result=lambda t, v: None)
    try:
        forward.gate.clear()
        first = asyncio.create_task(b.submit("first"))
        await asyncio.to_thread(forward.started.wait, 5)  # the first forward is running
        later = [asyncio.create_task(b.submit(t)) for t in ("x", "yy", "x")]
        await asyncio.sleep(0.01)
        forward.gate.set()
        await first
        out = await asyncio.gather(*later)
        assert forward.calls == [["first"], ["x", "yy"]]  # duplicates share one row
        assert [v.tolist() for v in out] == [[1.0, 0.0], [2.0, 1.0], [1.0, 0.0]]
    finally:
        b.close()


async def test_max_batch_and_cancelled_callers(forward: GatedForward) -> None:
    b = ForwardBatcher(forward, max_batch=2, on_result=lambda t, v: None)
    try:
        tasks = [asyncio.create_task(b.submit(t)) for t in ("a", "b", "c", "d", "e")]
        await asyncio.sleep(0)  # every task has joined a batch; none has started
        tasks[2].cancel()
        tasks[3].cancel()  # the whole second batch is gone: it never runs
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert forward.calls == [["a", "b"], ["e"]]
        assert [isinstance(d, asyncio.CancelledError) for d in done] == [False, False, True, True, False]
    finally:
        b.close()


async def test_an_error_reaches_its_batch_and_the_next_batch_runs(forward: GatedForward) -> None:
    b = ForwardBatcher(forward, max_batch=8, on_result=lambda t, v: None)
    try:
        forward.gate.clear()
        forward.fail_next = True
        failing = asyncio.create_task(b.submit("doomed"))
        await asyncio.to_thread(forward.started.wait, 5)
        after = asyncio.create_task(b.submit("fine"))
        await asyncio.sleep(0.01)
        forward.gate.set()
        with pytest.raises(RuntimeError, match="forward failed"):
            await failing
        assert (await after).tolist() == [4.0, 0.0]
        assert b.batches == 1  # only forwards that returned count
    finally:
        b.close()


async def test_concurrent_lookups_batch_their_embeddings(store: EntryStore,
                                                         cache_settings: CacheSettings) -> None:
    """The transformer's lookup path with the real embedder and Redis: 32 lookups at once (misses on
    an empty index, so each one embeds) share a few forward passes instead of running 32 (issue 26:
    concurrent semantic hits)."""
    from cache.embedder import Embedder
    from cache.semantic_cache import SemanticCache
    from cache.settings import EmbedderSettings
    from cache.verify import RuleVerifier
    from tests.cache.conftest import chat

    embedder = Embedder(EmbedderSettings(lru_size=0))
    try:
        cache = SemanticCache(store, embedder, RuleVerifier(), cache_settings)
        lone = await cache.lookup(chat("how do I reset my password, attempt 0"))
        assert lone.status == "miss" and (embedder.batches, embedder.batched_texts) == (1, 1)
        prompts = [f"how do I reset my password, attempt {i}" for i in range(1, 33)]
        results = await asyncio.gather(*(cache.lookup(chat(p)) for p in prompts))
        assert [r.status for r in results] == ["miss"] * 32
        assert embedder.batched_texts == 33  # every prompt embedded once
        # Each lookup reaches the embedder when its exact read answers, so the first forward may
        # start with few texts; the rest pile up behind it. Unbatched, it would be 32 forwards.
        assert embedder.batches - 1 <= 8, f"32 concurrent lookups took {embedder.batches - 1} forwards"
    finally:
        await embedder.aclose()
