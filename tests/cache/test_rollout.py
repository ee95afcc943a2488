"""What a model rollout needs from the cache: flushing one revision's entries, and an epoch that
makes every older entry unreadable at once (bumped by `semserve tenant promote`)."""

from __future__ import annotations

import dataclasses

from cache import keys
from cache.entry_store import EntryStore
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings

from .conftest import chat
from .doubles import HashingEmbedderDouble, ThresholdVerifierDouble

Q = "What is the capital of France?"
PARAPHRASE = "Tell me, what is the capital of France?"
emb = HashingEmbedderDouble()


async def put(store: EntryStore, prompt: str, **kw: object) -> None:
    await store.put(chat(prompt, **kw), prompt, await emb.embed(prompt), {"text": "A"})


async def test_flush_one_revision_across_tenants(store: EntryStore) -> None:
    await put(store, "q1", model_revision="r1")
    await put(store, "q2", model_revision="r1", tenant="other")
    await put(store, "q3", model_revision="r2")
    await put(store, "q4")  # no revision
    await put(store, "q5", model="m2", model_revision="r1")
    assert await store.flush_revision("r1", model="llm-test") == 0  # no such model
    assert await store.flush_revision("r1", tenant="acme", model=chat("x").model) == 1
    assert await store.get_exact(chat("q1", model_revision="r1")) is None
    assert await store.get_exact(chat("q2", model_revision="r1", tenant="other")) is not None
    # Every tenant and model of the deployment, one revision only.
    assert await store.flush_revision("r1") == 2
    assert await store.get_exact(chat("q2", model_revision="r1", tenant="other")) is None
    assert await store.get_exact(chat("q3", model_revision="r2")) is not None
    assert await store.get_exact(chat("q4")) is not None
    # The tenants' eviction sets lost the ids too, so the per-tenant cap counts correctly.
    stats = await store.stats()
    assert stats["tenants"] == {"acme": 2}
    zset = store.schema.tenant_zset_key(keys.tenant_tag("other"))
    assert await store.client.zcard(zset) == 0


def test_epoch_changes_every_key_but_zero_keeps_the_old_ones() -> None:
    base = chat(Q)
    assert keys.exact_key(dataclasses.replace(base, epoch=0)) == keys.exact_key(base)
    bumped = dataclasses.replace(base, epoch=1)
    assert keys.exact_key(bumped) != keys.exact_key(base)
    assert keys.fingerprint(bumped) != keys.fingerprint(base)


async def test_bumped_epoch_serves_nothing_older(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    verifier = ThresholdVerifierDouble(0.8)
    old = SemanticCache(store, HashingEmbedderDouble(), verifier, cache_settings)
    assert await old.store(chat(Q), {"text": "old model"})
    assert (await old.lookup(chat(Q))).status == "exact"
    assert (await old.lookup(chat(PARAPHRASE))).status == "semantic"
    # The same deployment after a promotion: epoch + 1, same Redis, same index.
    new = SemanticCache(store, HashingEmbedderDouble(), verifier,
                        dataclasses.replace(cache_settings, epoch=cache_settings.epoch + 1))
    assert (await new.lookup(chat(Q))).status == "miss"
    assert (await new.lookup(chat(PARAPHRASE))).status == "miss"  # not even semantically
    assert await new.store(chat(Q), {"text": "new model"})
    hit = await new.lookup(chat(Q))
    assert hit.status == "exact" and hit.answer == {"text": "new model"}
    # The callers' requests carry no epoch: the cache applies its own.
    assert (await old.lookup(chat(Q))).answer == {"text": "old model"}
