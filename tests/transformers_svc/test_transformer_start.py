"""The transformer's start (SemanticCacheTransformer.start_engine, which KServe runs beside the
servers): it creates the cache's index on a real Redis, and with Redis down it still returns, since
the transformer serves without its cache (fail open)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from cache.entry_store import EntryStore
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings
from tests.support import free_port
from transformers_svc.answer_pipeline import AnswerPipeline
from transformers_svc.config import TransformerSettings
from transformers_svc.model import SemanticCacheTransformer
from transformers_svc.predictor_client import PredictorClient


def transformer(cache: SemanticCache | None) -> SemanticCacheTransformer:
    settings = TransformerSettings.from_env()
    return SemanticCacheTransformer(settings, AnswerPipeline(settings, cache, PredictorClient(settings)))


def cache_on(redis_url: str) -> SemanticCache:
    settings = dataclasses.replace(
        CacheSettings.from_env(), redis_url=redis_url, deployment=f"start-{uuid.uuid4().hex[:8]}"
    )
    # The start touches only the store: no embedder or verifier is needed to create the index.
    return SemanticCache(EntryStore.from_settings(settings), None, None, settings)  # type: ignore[arg-type]


async def test_start_creates_the_cache_index(redis_url: str) -> None:
    cache = cache_on(redis_url)
    model = transformer(cache)
    assert model.engine, "KServe runs start_engine only for a model with `engine` set"
    try:
        await model.start_engine()
        assert cache.counters.index_created == 1
        await model.start_engine()  # a second start finds the index
        assert cache.counters.index_created == 1
    finally:
        await cache.close()


async def test_start_with_redis_down_still_returns() -> None:
    cache = cache_on(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    try:
        await transformer(cache).start_engine()
        assert cache.counters.index_created == 0
    finally:
        await cache.close()


async def test_start_without_a_cache() -> None:
    # --cache-policy off: nothing to start. The start returns at once and the model stays ready and
    # healthy, so readiness never waits on a Redis this deployment does not have.
    model = transformer(None)
    async with asyncio.timeout(1.0):
        await model.start_engine()
    assert model.pipeline.cache is None
    assert model.ready and await model.healthy()
