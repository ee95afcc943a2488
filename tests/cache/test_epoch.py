"""The cache epoch shared through Redis (cache.epoch), on a real Redis: each "replica" is its own
client, as separate processes would be; then two SemanticCaches on one Redis, as two replicas."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import redis
from fastapi import FastAPI
from redis.asyncio import Redis

from cache.entry_store import EntryStore
from cache.epoch import SharedEpoch
from cache.semantic_cache import SemanticCache
from semserve.tooling.local_redis import RedisServer, free_port
from transformers_svc.admin import register_admin_routes
from transformers_svc.auth import Authenticator, KeyEntry

from .conftest import chat, make_settings
from .doubles import HashingEmbedderDouble, ThresholdVerifierDouble

MODEL = "smollm2"


async def eventually(check: Callable[[], bool], within_s: float) -> float:
    """Seconds until `check()` held; fails past `within_s`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < within_s, f"not within {within_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


@pytest.fixture
async def clients(redis_server: RedisServer, clean_redis: redis.Redis) -> AsyncIterator[list[Redis]]:
    made = [Redis.from_url(redis_server.url, protocol=3) for _ in range(3)]
    yield made
    for c in made:
        await c.aclose()


def replica(client: Redis, floor: int = 0, refresh_s: float = 30.0) -> SharedEpoch:
    return SharedEpoch(client, "test", floor=floor, refresh_s=refresh_s, op_timeout_s=2.0)


async def test_a_bump_on_one_replica_is_announced_to_all(clients: list[Redis]) -> None:
    # A refresh far longer than the test: only the announcement can carry the bump.
    replicas = [replica(c) for c in clients]
    try:
        for r in replicas:
            r.start()
            await r.ensure(MODEL, 2.0)
            assert r.current(MODEL) == 0
        await asyncio.sleep(0.3)  # the listeners are subscribed
        assert await replicas[0].bump(MODEL) == 1
        assert replicas[0].current(MODEL) == 1  # the bumping replica at once
        took = await eventually(lambda: all(r.current(MODEL) == 1 for r in replicas), 2.0)
        assert took < 1.0
        assert await replicas[2].bump(MODEL) == 2
        await eventually(lambda: all(r.current(MODEL) == 2 for r in replicas), 2.0)
        assert replicas[1].counters.notified == 2
        # Per model: another model's epoch did not move.
        assert replicas[1].current("other-model") == 0
    finally:
        for r in replicas:
            await r.close()


async def test_a_missed_announcement_costs_at_most_the_refresh(
    clients: list[Redis], clean_redis: redis.Redis
) -> None:
    r = replica(clients[0], refresh_s=0.2)
    r.start()
    try:
        await r.ensure(MODEL, 2.0)
        clean_redis.hset(r.key, f"b:{MODEL}", 7)  # 7 bumps, written without a message
        assert await eventually(lambda: r.current(MODEL) == 7, 2.0) < 1.0
    finally:
        await r.close()


async def test_a_higher_setting_raises_the_shared_epoch(
    clients: list[Redis], clean_redis: redis.Redis
) -> None:
    old, new = replica(clients[0], floor=0), replica(clients[1], floor=3)
    await old.ensure(MODEL, 2.0)
    assert old.current(MODEL) == 0
    # A replica started by `semserve tenant promote` with --cache-epoch 3.
    await new.ensure(MODEL, 2.0)
    assert new.current(MODEL) == 3 and int(clean_redis.hget(new.key, f"s:{MODEL}") or 0) == 3
    await old.sync([MODEL])  # what its refresh does
    assert old.current(MODEL) == 3
    assert await old.bump(MODEL) == 4  # an admin bump
    await new.sync([MODEL])
    assert new.current(MODEL) == 4
    # The next promote starts replicas with --cache-epoch 4: the epoch must move again, although
    # an admin bump had already reached 4; the replicas still running follow.
    promoted = replica(clients[2], floor=4)
    await promoted.ensure(MODEL, 2.0)
    assert promoted.current(MODEL) == 5
    await old.sync([MODEL])
    assert old.current(MODEL) == 5


async def test_the_epoch_never_goes_down(clients: list[Redis], clean_redis: redis.Redis) -> None:
    """Redis restarted empty (or the field was deleted): a replica that knows a higher epoch keeps
    it and raises Redis back, so entries of an older epoch are never served again."""
    a, b = replica(clients[0]), replica(clients[1])
    await a.ensure(MODEL, 2.0)
    await a.bump(MODEL)
    await a.bump(MODEL)
    clean_redis.delete(a.key)
    await a.sync([MODEL])
    assert a.current(MODEL) == 2 and int(clean_redis.hget(a.key, f"b:{MODEL}") or 0) == 2
    await b.ensure(MODEL, 2.0)
    assert b.current(MODEL) == 2


async def test_concurrent_bumps_are_atomic(clients: list[Redis]) -> None:
    replicas = [replica(c) for c in clients]
    for r in replicas:
        await r.ensure(MODEL, 2.0)
    got = await asyncio.gather(*[r.bump(MODEL) for r in replicas for _ in range(5)])
    assert sorted(got) == list(range(1, 16))


async def test_redis_down_keeps_the_last_known_epoch(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = RedisServer(port=free_port(), data_dir=tmp_path_factory.mktemp("epoch-redis")).start()
    client = Redis.from_url(server.url, protocol=3, socket_timeout=0.5)
    r = SharedEpoch(client, "test", refresh_s=0.1, op_timeout_s=0.5)
    r.start()
    try:
        await r.ensure(MODEL, 2.0)
        await r.bump(MODEL)
        server.stop()
        errors = r.counters.errors
        await eventually(lambda: r.counters.errors > errors, 5.0)  # the refresh failed ...
        assert r.current(MODEL) == 1  # ... and the epoch stayed
        # A model first seen while Redis is down: an error within the budget (the cache fails
        # open: the request is not served from, nor stored in, an epoch nobody checked).
        started = time.monotonic()
        with pytest.raises((OSError, TimeoutError, redis.exceptions.RedisError)):
            await r.ensure("new-model", 0.3)
        assert not r.knows("new-model") and time.monotonic() - started < 1.5
        with pytest.raises((OSError, TimeoutError, redis.exceptions.RedisError)):
            await r.bump(MODEL)  # an admin asking for a bump is told it failed
    finally:
        await r.close()
        await client.aclose()
        server.stop()


async def test_two_caches_on_one_redis_follow_a_bump(
    redis_server: RedisServer, clean_redis: redis.Redis
) -> None:
    """What the transformer replicas do: a stored answer is a hit on both; after a bump on one, the
    same prompt is a miss on both (older entries are never served); the new answer, stored by one
    under the new epoch, is a hit on both."""
    settings = make_settings(redis_server.url, epoch_refresh_s=0.5)
    caches = []
    for _ in range(2):
        store = EntryStore.from_settings(settings)
        await store.ensure_index()
        cache = SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings)
        await cache.start()
        caches.append(cache)
    a, b = caches
    try:
        q = "What is the capital of France?"
        assert (await a.lookup(chat(q))).status == "miss"
        assert await a.store(chat(q), {"text": "Paris"})
        assert (await b.lookup(chat(q))).status == "exact"
        await asyncio.sleep(0.3)  # b's listener is subscribed
        assert a.epochs is not None and b.epochs is not None
        assert await a.epochs.bump(MODEL) == 1
        await eventually(lambda: b.epochs is not None and b.epochs.current(MODEL) == 1, 1.5)
        for cache in caches:
            res = await cache.lookup(chat(q))
            assert res.status == "miss", res  # neither exact nor the paraphrase-close old entry
        assert await b.store(chat(q), {"text": "Paris (new model)"})
        for cache in caches:
            hit = await cache.lookup(chat(q))
            assert hit.status == "exact" and hit.answer == {"text": "Paris (new model)"}
        # Another model of the same deployment keeps its epoch.
        assert (await a.lookup(chat("Hello there", model="other"))).status == "miss"
        assert a.epochs.current("other") == 0
    finally:
        for cache in caches:
            await cache.close()


async def test_the_admin_route_bumps_behind_the_admin_key(cache: SemanticCache) -> None:
    """POST /admin/cache/epoch (transformers_svc/admin.py): an admin key bumps and gets the new
    epoch; a tenant's key is refused (403), no key is 401, no model is 400; stats show the epoch."""
    def entry(key: str, tenant: str | None) -> KeyEntry:
        return KeyEntry(hashlib.sha256(key.encode()).digest(), tenant)

    app = FastAPI()
    register_admin_routes(app, cache, Authenticator([entry("k-acme", "acme"), entry("k-admin", None)], "x"))
    admin = {"authorization": "Bearer k-admin"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        await cache.lookup(chat("Hello"))  # the cache has synced MODEL's epoch
        r = await client.post("/admin/cache/epoch", params={"model": MODEL}, headers=admin)
        assert r.status_code == 200 and r.json() == {"model": MODEL, "epoch": 1}
        assert cache.epochs is not None and cache.epochs.current(MODEL) == 1
        stats = (await client.get("/admin/cache/stats", headers=admin)).json()["epoch"]
        assert stats["models"] == {MODEL: 1} and stats["setting"] == 0
        tenant = {"authorization": "Bearer k-acme"}
        refused = await client.post("/admin/cache/epoch", params={"model": MODEL}, headers=tenant)
        assert refused.status_code == 403
        assert (await client.post("/admin/cache/epoch", params={"model": MODEL})).status_code == 401
        assert (await client.post("/admin/cache/epoch", headers=admin)).status_code == 400
    assert cache.epochs.current(MODEL) == 1


async def test_no_read_or_write_before_the_epoch_is_known(
    redis_server: RedisServer, clean_redis: redis.Redis
) -> None:
    """A replica whose first read of the shared epoch failed neither serves nor stores under its
    (older) setting: the lookup is an error (the request goes to the predictor), the store is
    skipped; the next request reads the epoch and is served in it."""
    settings = make_settings(redis_server.url)
    old = SemanticCache(EntryStore.from_settings(settings), HashingEmbedderDouble(),
                        ThresholdVerifierDouble(0.8), settings)  # fmt: skip
    await old.entries.ensure_index()
    q = "What is the capital of France?"
    assert await old.store(chat(q), {"text": "Paris (old model)"})
    assert old.epochs is not None and await old.epochs.bump(MODEL) == 1
    new = SemanticCache(EntryStore.from_settings(settings), HashingEmbedderDouble(),
                        ThresholdVerifierDouble(0.8), settings)  # fmt: skip
    assert new.epochs is not None
    real_ensure = new.epochs.ensure

    async def failing(model: str, timeout_s: float) -> None:
        raise redis.exceptions.TimeoutError("slow Redis")

    new.epochs.ensure = failing  # type: ignore[method-assign]
    try:
        res = await new.lookup(chat(q))
        assert res.status == "error" and res.error is not None and "epoch" in res.error
        assert await new.store(chat(q), {"text": "stored under epoch 0"}) is False
        new.epochs.ensure = real_ensure  # type: ignore[method-assign]
        await asyncio.sleep(settings.degraded_retry_s * 2)  # Redis counted down: the next probe
        assert (await new.lookup(chat(q))).status == "miss"  # epoch 1: the old answer is gone
        assert new.epochs.current(MODEL) == 1
    finally:
        await old.close()
        await new.close()


async def test_close_returns_when_a_read_turns_the_cancel_into_a_timeout(
    clients: list[Redis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Python 3.11 a cancel that lands as a pub/sub read's own timeout expires comes out of the
    read as TimeoutError (asyncio.timeout's race), which the listener takes for a Redis failure: a
    close that relied on the cancel alone never returned (a transformer test hung 600 s)."""
    from redis.asyncio.client import PubSub

    read = PubSub.get_message

    async def cancel_lost(self: PubSub, *args: object, **kwargs: object) -> object:
        try:
            return await read(self, *args, **kwargs)
        except asyncio.CancelledError:
            raise TimeoutError("the cancel came out as the read's timeout") from None

    monkeypatch.setattr(PubSub, "get_message", cancel_lost)
    r = SharedEpoch(clients[0], "test", refresh_s=0.2, op_timeout_s=2.0)
    r.start()
    await asyncio.sleep(0.3)  # the listener is subscribed and reading
    await asyncio.wait_for(r.close(), 5.0)
