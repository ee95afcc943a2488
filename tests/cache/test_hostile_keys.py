"""Prompt-injection strings in cache keys and Redis tag fields, on the real Redis + RediSearch.

Tenant, model and fingerprint reach RediSearch queries only as sha256 hex digests
(cache.keys.tag_value), and the prompt is stored but never indexed or queried, so no string a
client controls can break a query or widen it. These tests hold that against strings full of
RediSearch syntax: entries are seeded for tenants A and B, then looked up, flushed, inspected and
counted under hostile tenant/model/prompt strings; nothing of B ever comes back for anyone else.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache.entry_store import EntryStore
from cache.keys import CacheRequest
from cache.semantic_cache import SemanticCache

from .conftest import chat

HOSTILE = [
    "*", "-", "|", "(", ")", "{", "}", "\\", '"', "'", "%", "%%", "=>", "[KNN", "$vec", "@",
    "@tenant:{*}", "@tenant:{A}", "A | B", "A|B", "-A", "(A)", "{A}", "A*", "*A*", "%A%", "A\\",
    "A} | @tenant:{B", "A}) | (@tenant:{*", "B\n", "\nB", "A\r\nB", "A\x00B", "\x00", " ", "A ", " A",
    "=>[KNN 100 @vec $vec AS dist]", "@model:{*} @fp:{*}", "*=>[KNN 5 @vec $vec]", "~A", "A -B",
    "@tenant:{" + "a" * 64 + "}", "a" * 64, "ＡＢ", "Ａ", "A\u200b", "\u202eB", "Å", "A\u0301", "🙂",
    "ß", "SS", "İ", "i̇", "\ud800", "A" * 10_000, "$", "$0", "PARAMS", "DIALECT 1", "INFIELDS 1 prompt",
]
A, B = "A", "B"
PROMPTS = ["What is the capital of France?", "@tenant:{B} what is 2+2?", "Explain recursion."]


def _answer(tenant: str, prompt: str) -> dict[str, Any]:
    # The owner travels inside the payload, so any hit can be checked against the requester.
    return {"text": f"answer for {prompt}", "tenant": tenant}


async def _seed(cache: SemanticCache) -> None:
    for tenant, prompt in itertools.product((A, B), PROMPTS):
        assert await cache.store(chat(prompt, tenant=tenant), _answer(tenant, prompt))


def _owner(res: Any) -> str | None:
    return res.answer["tenant"] if res.answer else None


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_tenant_never_reads_another(cache: SemanticCache, hostile: str) -> None:
    await _seed(cache)
    for prompt in [*PROMPTS, hostile]:
        res = await cache.lookup(chat(prompt, tenant=hostile))
        assert res.status in ("miss", "bypass"), (hostile, prompt, res)
    # And the owners still get exactly their own entries.
    for tenant in (A, B):
        res = await cache.lookup(chat(PROMPTS[0], tenant=tenant))
        assert res.status == "exact" and _owner(res) == tenant


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_prompt_and_model_stay_in_tenant(cache: SemanticCache, hostile: str) -> None:
    await _seed(cache)
    assert await cache.store(chat(hostile, tenant=A), _answer(A, hostile)) or not hostile.strip()
    for tenant in (A, B):
        res = await cache.lookup(chat(hostile, tenant=tenant))
        assert _owner(res) in (None, tenant), (hostile, tenant, res)
        # A model string with query syntax is only ever its own model.
        res = await cache.lookup(chat(PROMPTS[0], tenant=tenant, model=hostile))
        assert res.status == "miss", (hostile, res)


@pytest.mark.parametrize("hostile", HOSTILE)
async def test_hostile_admin_operations_stay_in_tenant(cache: SemanticCache, hostile: str) -> None:
    store: EntryStore = cache.entries
    await _seed(cache)
    assert await store.inspect(hostile) == []
    stats = await store.stats(hostile)
    assert stats["tenants"] == {hostile: 0}
    assert await store.flush(hostile) == 0
    assert await store.flush(hostile, model=hostile) == 0
    totals = (await store.stats())["tenants"]
    assert totals == {A: len(PROMPTS), B: len(PROMPTS)}


async def test_hostile_tenants_are_apart_from_each_other(cache: SemanticCache) -> None:
    # Every hostile string is a tenant of its own here: each one sees only what it stored.
    tenants = [h for h in HOSTILE if h]
    for t in tenants:
        assert await cache.store(chat(PROMPTS[2], tenant=t), _answer(t, PROMPTS[2]))
    for t in tenants:
        res = await cache.lookup(chat(PROMPTS[2], tenant=t))
        assert res.status == "exact" and _owner(res) == t, (t, res)
        res = await cache.lookup(chat("Explain recursion to me, please.", tenant=t))
        assert _owner(res) in (None, t), (t, res)
    totals = (await cache.entries.stats())["tenants"]
    assert all(n == 1 for n in totals.values()) and len(totals) == len(set(tenants))


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(tenant=st.text(min_size=1, max_size=30) | st.sampled_from(HOSTILE),
       prompt=st.text(max_size=60) | st.sampled_from(HOSTILE + PROMPTS))
async def test_random_strings_never_see_b(cache: SemanticCache, tenant: str, prompt: str) -> None:
    # The fixture is shared by all examples: seed once.
    if (await cache.entries.stats(B))["tenants"].get(B, 0) == 0:
        await _seed(cache)
    if tenant in (A, B):
        return
    for p in (prompt, *PROMPTS):
        res = await cache.lookup(CacheRequest(tenant=tenant, model="smollm2", kind="chat", prompt=p))
        assert not res.hit, (tenant, p, res)
