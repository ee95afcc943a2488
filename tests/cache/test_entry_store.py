"""EntryStore against a real Redis + RediSearch."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import redis

from cache import keys
from cache.entry_store import EntryStore
from cache.schema import F_SCOPE, SCHEMA_VERSION
from cache.settings import CacheSettings

from .conftest import chat
from .doubles import HashingEmbedderDouble
from .test_keys import HOSTILE

emb = HashingEmbedderDouble()


async def put(store: EntryStore, prompt: str, answer: str = "A", ttl: int | None = None, **kw) -> str:
    req = chat(prompt, **kw)
    return await store.put(req, prompt, await emb.embed(prompt), {"text": answer}, ttl)


async def test_ensure_index_is_idempotent(store: EntryStore, clean_redis: redis.Redis) -> None:
    assert await store.ensure_index() is False  # the fixture created it
    clean_redis.flushall()
    assert await store.ensure_index() is True
    assert await store.ensure_index() is False


async def test_exact_hit_and_miss(store: EntryStore) -> None:
    entry_id = await put(store, "What is the capital of France?", "Paris")
    hit = await store.get_exact(chat("What is the capital of  France? "))
    assert hit is not None and hit.answer == {"text": "Paris"} and hit.entry_id == entry_id
    assert hit.similarity == 1.0 and hit.created_at > 0
    assert await store.get_exact(chat("What is the capital of Spain?")) is None


async def test_search_returns_similar_entries_best_first(store: EntryStore) -> None:
    await put(store, "What is the capital of France?", "Paris")
    await put(store, "How do I bake sourdough bread at home?", "Bread")
    q = "Tell me, what is the capital of France?"
    found = await store.search(chat(q), await emb.embed(q), k=5)
    assert [c.answer["text"] for c in found] == ["Paris", "Bread"]
    assert found[0].prompt == "What is the capital of France?"
    assert 0.8 < found[0].similarity < 1.0 and found[1].similarity < 0.5


async def test_tenant_and_fingerprint_filter_the_search(store: EntryStore) -> None:
    p = "What is the capital of France?"
    await put(store, p, "Paris")
    v = await emb.embed(p)
    assert len(await store.search(chat(p), v)) == 1
    assert await store.search(chat(p, tenant="other"), v) == []
    assert await store.get_exact(chat(p, tenant="other")) is None
    assert await store.search(chat(p, model="other"), v) == []
    assert await store.search(chat(p, context={"system": "be brief"}), v) == []
    assert await store.search(chat(p, kind="completion"), v) == []


async def test_knn_filters_on_one_scope_tag(store: EntryStore, clean_redis: redis.Redis) -> None:
    req = chat("What is the capital of France?", model_revision="r1", epoch=3)
    entry_id = await put(store, req.prompt, model_revision="r1", epoch=3)
    stored = clean_redis.hget(store.schema.entry_key(entry_id), F_SCOPE)
    assert stored == keys.scope_tag(req).encode()
    # The pre-filter is a single tag: no intersection with tags that match the whole deployment.
    assert store._filter(req) == f"@{F_SCOPE}:{{{keys.scope_tag(req)}}}"


async def test_knn_never_returns_another_scopes_entry(store: EntryStore) -> None:
    """Entries with the very same prompt and vector in many scopes: each KNN sees only its own."""
    p = "What is the capital of France?"
    v = await emb.embed(p)
    scopes = [
        {}, {"tenant": "other"}, {"model": "m2"}, {"model_revision": "r2"}, {"kind": "completion"},
        {"context": {"system": "be brief"}}, {"sampling": keys.SamplingKey(temperature=0.5)},
        {"epoch": 1}, {"tenant": "other", "model": "m2", "epoch": 1},
    ]  # fmt: skip
    for i, scope in enumerate(scopes):
        await put(store, p, f"scope {i}", **scope)
    for i, scope in enumerate(scopes):
        found = await store.search(chat(p, **scope), v, k=len(scopes))
        assert [c.answer["text"] for c in found] == [f"scope {i}"], scope
    assert await store.search(chat(p, tenant="nobody"), v, k=len(scopes)) == []
    # Per-tenant admin operations still go by the tenant tag, across the tenant's scopes.
    assert (await store.stats())["tenants"] == {"acme": 7, "other": 2}
    assert len(await store.inspect("other")) == 2
    assert await store.flush("other", model="m2") == 1
    assert await store.flush("other") == 1
    assert (await store.stats())["tenants"] == {"acme": 7}


async def test_ttl_expiry_is_fixed(store: EntryStore) -> None:
    p = "short lived"
    await put(store, p, ttl=1)
    await put(store, "long lived")
    for _ in range(3):  # reads do not extend the lifetime
        assert await store.get_exact(chat(p)) is not None
    await asyncio.sleep(1.15)
    assert await store.get_exact(chat(p)) is None
    assert all(c.prompt != p for c in await store.search(chat(p), await emb.embed(p)))
    assert await store.get_exact(chat("long lived")) is not None


async def test_eviction_keeps_the_newest_per_tenant(cache_settings: CacheSettings) -> None:
    cache_settings.max_entries_per_tenant = 3
    store = EntryStore.from_settings(cache_settings)
    await store.ensure_index()
    try:
        for i in range(5):
            await put(store, f"question number {i}")
        await put(store, "other tenant question", tenant="other")
        present = [await store.get_exact(chat(f"question number {i}")) is not None for i in range(5)]
        assert present == [False, False, True, True, True]
        assert await store.get_exact(chat("other tenant question", tenant="other")) is not None
        assert (await store.stats("acme"))["tenants"] == {"acme": 3}
        # Overwriting an existing entry does not evict another one.
        await put(store, "question number 4", "new")
        assert (await store.get_exact(chat("question number 4"))).answer == {"text": "new"}  # type: ignore[union-attr]
        assert await store.get_exact(chat("question number 2")) is not None
    finally:
        await store.close()


async def test_flush_by_tenant_and_model(store: EntryStore) -> None:
    await put(store, "q1")
    await put(store, "q2", model="m2")
    await put(store, "q3", model="m2", model_revision="r2")
    await put(store, "q1", tenant="other")
    await put(store, "q1", tenant="other", model="m2")
    assert await store.flush("acme", model="m2") == 2  # all revisions of m2
    assert await store.get_exact(chat("q1")) is not None
    assert await store.get_exact(chat("q2", model="m2")) is None
    assert await store.get_exact(chat("q1", tenant="other", model="m2")) is not None
    assert await store.flush("acme") == 1
    assert await store.get_exact(chat("q1")) is None
    assert await store.get_exact(chat("q1", tenant="other")) is not None
    stats = await store.stats()
    assert stats["tenants"] == {"other": 2} and stats["num_docs"] == 2


async def test_hostile_tenants_and_models_never_widen_or_error(store: EntryStore) -> None:
    p = "What is the capital of France?"
    v = await emb.embed(p)
    await put(store, p, "victim")
    for t in HOSTILE:
        assert await store.search(chat(p, tenant=t), v) == []
        assert await store.get_exact(chat(p, tenant=t)) is None
        assert await store.search(chat(p, model=t), v) == []
        assert await store.flush(t, model=t) == 0
    for i, t in enumerate(HOSTILE):
        await put(store, p, f"own {i}", tenant=t, model=t)
    for i, t in enumerate(HOSTILE):
        found = await store.search(chat(p, tenant=t, model=t), v)
        assert [c.answer["text"] for c in found] == [f"own {i}"]
    assert (await store.get_exact(chat(p))).answer == {"text": "victim"}  # type: ignore[union-attr]
    stats = await store.stats()
    assert stats["tenants"]["acme"] == 1 and stats["tenants"]["*"] == 1
    assert await store.flush("*") == 1
    assert await store.get_exact(chat(p)) is not None
    inspected = await store.inspect("a\x00b")
    assert len(inspected) == 1 and inspected[0]["model"] == "a\x00b"


async def test_schema_version_bump_does_not_read_old_entries(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    p = "What is the capital of France?"
    await put(store, p, "old")
    v2 = EntryStore.from_settings(cache_settings, schema_version=SCHEMA_VERSION + 1, client=store.client)
    assert await v2.ensure_index() is True
    assert v2.schema.index_name != store.schema.index_name
    assert await v2.get_exact(chat(p)) is None
    assert await v2.search(chat(p), await emb.embed(p)) == []
    assert (await v2.stats())["num_docs"] == 0
    assert await store.get_exact(chat(p)) is not None


async def test_stats_and_inspect(store: EntryStore) -> None:
    await put(store, "first", "1")
    await asyncio.sleep(0.01)
    await put(store, "second", "2", model="m2", model_revision="r1")
    stats = await store.stats()
    assert stats["tenants"] == {"acme": 2} and stats["num_docs"] == 2 and stats["index_exists"]
    assert stats["vector_index_sz_mb"] > 0 and stats["redis_used_memory_bytes"] > 0
    assert (await store.stats("nobody"))["tenants"] == {"nobody": 0}
    rows = await store.inspect("acme", limit=5)
    assert [r["prompt"] for r in rows] == ["second", "first"]
    assert rows[0]["model"] == "m2@r1" and rows[0]["answer"] == {"text": "2"}
    assert 86000 < rows[0]["expires_in_s"] <= 86400
    assert len(await store.inspect("acme", limit=1)) == 1


async def test_put_rejects_wrong_dimension(store: EntryStore) -> None:
    with pytest.raises(ValueError):
        await store.put(chat("x"), "x", np.zeros(10, np.float32), {"a": 1})
    # The entry id is the exact key.
    entry_id = await store.put(chat("x"), "x", np.ones(store.schema.dim, np.float32), {"a": 1})
    assert keys.exact_key(chat("x")) == entry_id


async def test_search_and_inspect_keep_stored_text_byte_exact(store: EntryStore) -> None:
    # Prompts come back as stored, lone surrogates included (the search API's own decoding would
    # replace them), and an entry that expired between match and load is skipped.
    p = "caf\u00e9 \ud800 what is the capital of France?"
    await put(store, p, "Paris")
    found = await store.search(chat(p), await emb.embed(p))
    assert [c.prompt for c in found] == [p] and found[0].answer == {"text": "Paris"}
    assert [r["prompt"] for r in await store.inspect("acme")] == [p]
    await store.client.hdel(store.schema.entry_key(found[0].entry_id), "answer")
    assert await store.search(chat(p), await emb.embed(p)) == []
    assert await store.inspect("acme") == []


async def test_index_dimension_is_checked_through_ft_info(cache_settings: CacheSettings) -> None:
    from cache.entry_store import SchemaMismatchError

    small = EntryStore.from_settings(dataclasses.replace(cache_settings, embedding_dim=8))
    try:
        assert await small.ensure_index() is True
        other = EntryStore.from_settings(cache_settings, client=small.client)
        with pytest.raises(SchemaMismatchError):
            await other.ensure_index()
    finally:
        await small.close()


async def test_search_reads_a_resp2_reply_like_a_resp3_one(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    # search() sends raw FT.SEARCH and reads the reply itself: both reply shapes give the same result.
    import redis.asyncio as aioredis

    emb = HashingEmbedderDouble()
    for p in ["How do I reset my password?", "How can I reset my password quickly?", "Weather in Oslo?"]:
        await store.put(chat(p), p, await emb.embed(p), {"text": f"answer to {p}"})
    q = "How do I reset the password?"
    resp2 = EntryStore(
        aioredis.Redis.from_url(cache_settings.redis_url, protocol=2, decode_responses=False), store.schema
    )
    try:
        vec = await emb.embed(q)
        expected = await store.search(chat(q), vec, k=3)
        assert len(expected) == 3 and expected[0].answer == {"text": f"answer to {expected[0].prompt}"}
        assert await resp2.search(chat(q), vec, k=3) == expected
    finally:
        await resp2.close()
