"""Fail open: a dead, hung or missing Redis costs a bounded delay and no exception, and caching
comes back by itself. Each test runs its own Redis, so the shared one is never disturbed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cache import keys
from cache.entry_store import EntryStore
from cache.semantic_cache import SemanticCache
from semserve.tooling.local_redis import RedisServer, free_port

from .conftest import chat, make_settings, serve
from .doubles import HashingEmbedderDouble, ThresholdVerifierDouble

Q = "What is the capital of France?"
PARAPHRASE = "Tell me, what is the capital of France?"
BOUND_S = 1.0  # generous bound for a shared CI box; budgets below are 150 ms


def make_cache(url: str) -> SemanticCache:
    settings = make_settings(url, lookup_timeout_ms=150.0, store_timeout_ms=300.0, degraded_retry_s=0.05)
    store = EntryStore.from_settings(settings)
    return SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings)


@pytest.fixture
def own_server(tmp_path: Path) -> RedisServer:
    server = RedisServer(port=free_port(), data_dir=tmp_path / "redis")
    server.start()
    yield server
    if server.running:
        server.stop()


@pytest.fixture
async def own_cache(own_server: RedisServer) -> AsyncIterator[SemanticCache]:
    cache = make_cache(own_server.url)
    await cache.start()
    yield cache
    await cache.close()


async def timed_lookup(cache: SemanticCache, prompt: str = Q) -> tuple[str, float]:
    t = time.perf_counter()
    res = await cache.lookup(chat(prompt))
    return res.status, time.perf_counter() - t


async def test_redis_stopped_then_restarted_empty(
    own_server: RedisServer, own_cache: SemanticCache, caplog: pytest.LogCaptureFixture
) -> None:
    cache = own_cache
    assert await cache.store(chat(Q), {"text": "Paris"})
    assert (await cache.lookup(chat(Q))).status == "exact"

    own_server.stop()
    caplog.set_level(logging.INFO, logger="cache.semantic_cache")
    statuses = []
    for _ in range(5):
        status, took = await timed_lookup(cache)
        statuses.append(status)
        assert took < BOUND_S
        await asyncio.sleep(0.02)
    assert set(statuses) == {"error"} and cache.degraded
    assert await cache.store(chat(Q), {"text": "x"}) is False
    assert cache.counters.redis_errors >= 1 and cache.counters.lookups["error"] == 5
    degraded_lines = [r for r in caplog.records if r.getMessage() == "cache_degraded"]
    assert len(degraded_lines) == 1  # one line per state change, not per request

    created_before = cache.counters.index_created
    own_server.start()  # same port, empty: no index, no entries
    await asyncio.sleep(0.06)  # past degraded_retry_s
    status, _ = await timed_lookup(cache)
    assert status == "miss" and not cache.degraded
    assert cache.counters.index_created == created_before + 1
    assert [r.getMessage() for r in caplog.records].count("cache_recovered") == 1
    assert await cache.store(chat(Q), {"text": "Paris again"})
    assert (await cache.lookup(chat(Q))).status == "exact"
    assert (await cache.lookup(chat(PARAPHRASE))).status == "semantic"


async def test_redis_restarted_between_requests_recreates_index(
    own_server: RedisServer, own_cache: SemanticCache
) -> None:
    # No failed request in between: the first search finds no index and recreates it.
    assert await own_cache.store(chat(Q), {"text": "Paris"})
    own_server.stop()
    own_server.start()
    res = None
    for _ in range(3):  # the first call after the restart may hit the stale pooled connection
        res = await own_cache.lookup(chat(PARAPHRASE))
        if res.status == "miss":
            break
        await asyncio.sleep(0.06)
    assert res is not None and res.status == "miss"
    assert await own_cache.store(chat(Q), {"text": "Paris"})
    assert (await own_cache.lookup(chat(PARAPHRASE))).status == "semantic"


async def test_hung_redis_times_out(own_server: RedisServer, own_cache: SemanticCache) -> None:
    assert await own_cache.store(chat(Q), {"text": "Paris"})
    assert own_server.process is not None
    pid = own_server.process.pid
    os.kill(pid, signal.SIGSTOP)  # accepts nothing, answers nothing: a hung server
    try:
        status, took = await timed_lookup(own_cache, PARAPHRASE)
        assert status == "error" and took < BOUND_S
        t = time.perf_counter()
        assert await own_cache.store(chat("another"), {"text": "y"}) is False
        assert time.perf_counter() - t < BOUND_S
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(0.06)
    for _ in range(3):
        status, _ = await timed_lookup(own_cache, PARAPHRASE)
        if status != "error":
            break
        await asyncio.sleep(0.06)
    assert status == "semantic" and not own_cache.degraded


async def test_redis_never_started() -> None:
    cache = make_cache(f"redis://127.0.0.1:{free_port()}/0")
    t = time.perf_counter()
    await cache.start()  # must not raise
    res = await cache.lookup(chat(Q))
    assert res.status == "error" and res.error
    assert await cache.store(chat(Q), {"text": "Paris"}) is False

    async def produce() -> dict:
        return {"text": "from the predictor"}

    res, answer = await serve(cache, chat(Q), produce)
    assert res.status == "error" and answer == {"text": "from the predictor"}
    assert time.perf_counter() - t < 2 * BOUND_S
    await cache.close()


async def test_failing_embedder_fails_open(own_cache: SemanticCache) -> None:
    class BrokenEmbedderDouble(HashingEmbedderDouble):
        async def embed(self, text: str):  # type: ignore[override]
            raise RuntimeError("model not loaded")

    own_cache.embedder = BrokenEmbedderDouble()
    res = await own_cache.lookup(chat(Q))
    assert res.status == "error" and "embedder" in (res.error or "")
    assert own_cache.counters.embed_errors == 1 and not own_cache.degraded
    assert await own_cache.store(chat(Q), {"text": "Paris"}) is False


async def test_broken_verifier_and_corrupt_entry_fail_open(
    own_server: RedisServer, own_cache: SemanticCache
) -> None:
    class BrokenVerifierDouble(ThresholdVerifierDouble):
        def check(self, query: str, candidate: str, similarity: float):  # type: ignore[override]
            raise ZeroDivisionError("bug")

    assert await own_cache.store(chat(Q), {"text": "Paris"})
    own_cache.verifier = BrokenVerifierDouble()
    res = await own_cache.lookup(chat(PARAPHRASE))
    assert res.status == "miss" and res.verdict is not None and res.verdict.rule == "verifier_error"
    assert own_cache.counters.verifier_errors == 1

    import redis as sync_redis

    client = sync_redis.Redis.from_url(own_server.url)
    key = own_cache.entries.schema.entry_key(keys.exact_key(chat(Q), own_cache.entries.schema.version))
    client.hset(key, "answer", b"{not json")
    client.close()
    res = await own_cache.lookup(chat(Q))
    assert res.status == "error" and own_cache.counters.internal_errors == 1 and not own_cache.degraded
