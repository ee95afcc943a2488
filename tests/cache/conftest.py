"""One real Redis (Valkey + RediSearch) for the whole cache test session, emptied before each test
that asks for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from cache.entry_store import EntryStore
from cache.keys import CacheRequest
from cache.semantic_cache import LookupResult, SemanticCache
from cache.settings import CacheSettings
from semserve.tooling.local_redis import RedisServer, free_port
from tests.cache.doubles import HashingEmbedderDouble, ThresholdVerifierDouble


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def clean_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()  # also drops the RediSearch indexes
    yield client
    client.close()


def make_settings(url: str, **overrides: Any) -> CacheSettings:
    # Generous budgets: the test machine is small and shared; fail-open tests set their own.
    values: dict[str, Any] = {
        "redis_url": url,
        "deployment": "test",
        "lookup_timeout_ms": 2000.0,
        "store_timeout_ms": 2000.0,
        "degraded_retry_s": 0.05,
        "singleflight_wait_s": 5.0,
    }
    values.update(overrides)
    return CacheSettings(**values)


@pytest.fixture
def cache_settings(redis_server: RedisServer, clean_redis: redis.Redis) -> CacheSettings:
    return make_settings(redis_server.url)


@pytest.fixture
async def store(cache_settings: CacheSettings) -> AsyncIterator[EntryStore]:
    s = EntryStore.from_settings(cache_settings)
    await s.ensure_index()
    yield s
    await s.close()


@pytest.fixture
async def cache(store: EntryStore, cache_settings: CacheSettings) -> SemanticCache:
    return SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), cache_settings)


def chat(prompt: str, tenant: str = "acme", model: str = "smollm2", **kw: Any) -> CacheRequest:
    return CacheRequest(tenant=tenant, model=model, kind=kw.pop("kind", "chat"), prompt=prompt, **kw)


async def serve(
    cache: SemanticCache, req: CacheRequest, produce: Callable[[], Awaitable[Any]]
) -> tuple[LookupResult, Any]:
    """Lookup, and on anything but a hit `produce` and store its answer (the transformer does the
    same through one shared generation: transformers_svc/answer_pipeline.py)."""
    res = await cache.lookup(req)
    if res.hit:
        return res, res.answer
    answer = await produce()
    await cache.store(req, answer, res.vector)
    return res, answer
