"""SemanticCache: lookup order, verifier and counters, on a real Redis (single flight through the
cache: tests/transformers_svc/test_answer_pipeline.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cache.entry_store import EntryStore
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings

from .conftest import chat
from .doubles import HashingEmbedderDouble, ThresholdVerifierDouble

Q = "What is the capital of France?"
PARAPHRASE = "Tell me, what is the capital of France?"


async def test_miss_then_exact_hit_without_embedding(cache: SemanticCache) -> None:
    res = await cache.lookup(chat(Q))
    assert res.status == "miss" and res.vector is not None
    assert await cache.store(chat(Q), {"text": "Paris"}, res.vector)
    emb = cache.embedder
    assert isinstance(emb, HashingEmbedderDouble)
    calls = emb.calls
    hit = await cache.lookup(chat("  What is the capital of   France?"))
    assert hit.status == "exact" and hit.answer == {"text": "Paris"} and hit.similarity == 1.0
    assert emb.calls == calls  # exact hits never embed
    assert set(hit.timings) == {"exact", "total"}
    assert cache.counters.lookups["miss"] == 1 and cache.counters.lookups["exact"] == 1


async def test_semantic_hit_via_verifier(cache: SemanticCache) -> None:
    await cache.store(chat(Q), {"text": "Paris"})
    res = await cache.lookup(chat(PARAPHRASE))
    assert res.status == "semantic" and res.answer == {"text": "Paris"}
    assert res.cached_prompt == Q and res.verdict is not None and res.verdict.accept
    assert 0.8 <= (res.similarity or 0) < 1.0
    assert {"exact", "embed", "search", "verify", "total"} <= set(res.timings)


async def test_verifier_rejection_is_a_miss(store: EntryStore, cache_settings: CacheSettings) -> None:
    strict = ThresholdVerifierDouble(0.99)
    cache = SemanticCache(store, HashingEmbedderDouble(), strict, cache_settings)
    await cache.store(chat(Q), {"text": "Paris"})
    res = await cache.lookup(chat(PARAPHRASE))
    assert res.status == "miss" and res.verdict is not None and not res.verdict.accept
    assert res.candidates == 1 and strict.calls == 1 and cache.counters.verifier_rejections == 1


async def test_min_similarity_floor_skips_verifier(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    verifier = ThresholdVerifierDouble(0.0)  # would accept anything it is shown
    cache = SemanticCache(store, HashingEmbedderDouble(), verifier, cache_settings)
    await cache.store(chat(Q), {"text": "Paris"})
    res = await cache.lookup(chat("How do I bake sourdough bread?"))
    assert res.status == "miss" and res.candidates == 0 and verifier.calls == 0


async def test_tenant_isolation(cache: SemanticCache) -> None:
    await cache.store(chat(Q, tenant="a"), {"text": "Paris"})
    assert (await cache.lookup(chat(Q, tenant="a"))).status == "exact"
    assert (await cache.lookup(chat(Q, tenant="b"))).status == "miss"
    assert (await cache.lookup(chat(PARAPHRASE, tenant="b"))).status == "miss"


async def test_context_and_sampling_isolate_answers(cache: SemanticCache) -> None:
    from cache.keys import SamplingKey

    await cache.store(chat(Q), {"text": "Paris"})
    assert (await cache.lookup(chat(Q, context={"system": "Answer in French."}))).status == "miss"
    assert (await cache.lookup(chat(Q, sampling=SamplingKey(max_tokens=5)))).status == "miss"


async def test_bypass(cache: SemanticCache) -> None:
    await cache.store(chat(Q), {"text": "Paris"})
    assert (await cache.lookup(chat(Q, bypass=True))).status == "bypass"
    assert (await cache.lookup(chat("   "))).status == "bypass"
    assert await cache.store(chat("x", bypass=True), {"text": "no"}) is False


async def test_store_of_unserializable_answer_fails_soft(cache: SemanticCache) -> None:
    assert await cache.store(chat(Q), {"bad": object()}) is False
    assert cache.counters.store_errors == 1 and not cache.degraded


def test_embedder_dim_mismatch_is_refused(store: EntryStore, cache_settings: CacheSettings) -> None:
    with pytest.raises(ValueError):
        SemanticCache(store, HashingEmbedderDouble(dim=128), ThresholdVerifierDouble(), cache_settings)


async def test_entries_is_the_store_of_the_entries(cache: SemanticCache) -> None:
    # The public accessor the admin routes use: stats, flush and inspect over this cache's entries.
    await cache.store(chat(Q), {"text": "Paris"})
    assert (await cache.entries.stats("acme"))["tenants"] == {"acme": 1}
    assert [r["prompt"] for r in await cache.entries.inspect("acme")] == [Q]
    assert await cache.entries.flush("acme") == 1
    assert (await cache.lookup(chat(Q))).status == "miss"


def _cache_embedding_during_exact(
    store: EntryStore, cache_settings: CacheSettings, delay_s: float = 0.0
) -> SemanticCache:
    settings = dataclasses.replace(cache_settings, embed_during_exact=True)
    embedder = HashingEmbedderDouble(delay_s=delay_s)
    return SemanticCache(store, embedder, ThresholdVerifierDouble(0.8), settings)


async def test_embed_during_exact_serves_the_same_and_embeds_once(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    cache = _cache_embedding_during_exact(store, cache_settings)
    emb = cache.embedder
    assert isinstance(emb, HashingEmbedderDouble)
    await cache.store(chat(Q), {"text": "Paris"})
    calls = emb.calls
    res = await cache.lookup(chat(PARAPHRASE))
    assert res.status == "semantic" and res.answer == {"text": "Paris"} and res.vector is not None
    assert emb.calls == calls + 1
    assert {"exact", "embed", "search", "verify", "total"} <= set(res.timings)
    miss = await cache.lookup(chat("How do I bake sourdough bread?"))
    assert miss.status == "miss" and miss.vector is not None and emb.calls == calls + 2


async def test_embed_during_exact_an_exact_hit_does_not_wait_for_the_embedding(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    cache = _cache_embedding_during_exact(store, cache_settings, delay_s=2.0)
    await cache.store(chat(Q), {"text": "Paris"}, await HashingEmbedderDouble().embed(Q))
    before = {t for t in asyncio.all_tasks() if not t.done()}
    hit = await asyncio.wait_for(cache.lookup(chat(Q)), 1.0)  # the 2 s embedding is not awaited
    assert hit.status == "exact" and hit.answer == {"text": "Paris"} and hit.vector is None
    assert set(hit.timings) == {"exact", "total"}
    await asyncio.sleep(0)
    left = {t for t in asyncio.all_tasks() if not t.done()} - before - {asyncio.current_task()}
    assert not left  # the embedding was cancelled, not left running


async def test_embed_during_exact_a_redis_error_cancels_the_embedding(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    cache = _cache_embedding_during_exact(store, cache_settings, delay_s=2.0)

    async def broken(req: object) -> None:
        raise ConnectionError("redis went away")

    store.get_exact = broken  # type: ignore[method-assign]
    res = await asyncio.wait_for(cache.lookup(chat(Q)), 1.0)
    assert res.status == "error" and res.error is not None and "exact" in res.error
