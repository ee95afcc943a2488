"""Cross-replica single flight (cache.lease) on a real Redis: each "replica" is its own client, as
separate processes would be."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
from redis.asyncio import Redis

from cache.lease import ReplicaFlights
from semserve.tooling.local_redis import RedisServer, free_port


@pytest.fixture
async def replicas(
    redis_server: RedisServer, clean_redis: redis.Redis
) -> AsyncIterator[list[ReplicaFlights]]:
    clients = [Redis.from_url(redis_server.url, protocol=3) for _ in range(3)]
    yield [ReplicaFlights(c, "test", lease_ms=600, op_timeout_s=2.0) for c in clients]
    for c in clients:
        await c.aclose()


async def test_one_leader_the_others_are_notified_of_its_answer(replicas: list[ReplicaFlights]) -> None:
    first = await replicas[0].claim("k", wait_s=10)
    assert first.role == "leader"
    waiters = [asyncio.ensure_future(r.claim("k", wait_s=10)) for r in replicas[1:]]
    await asyncio.sleep(1.5)  # longer than the lease: the leader's renewal keeps it
    assert not any(w.done() for w in waiters)
    released = time.monotonic()
    await first.release(answered=True)
    claims = await asyncio.gather(*waiters)
    assert [c.role for c in claims] == ["answered", "answered"]
    # Notified: not a poll of the lease every lease_ms.
    assert time.monotonic() - released < 0.4
    # A latecomer (looked up before the store, claims after it) reads the answer too.
    assert (await replicas[1].claim("k", wait_s=10)).role == "answered"


async def test_a_leader_that_gives_up_hands_over_to_one_waiter(replicas: list[ReplicaFlights]) -> None:
    first = await replicas[0].claim("k", wait_s=10)
    waiters = [asyncio.ensure_future(r.claim("k", wait_s=10)) for r in replicas[1:]]
    await asyncio.sleep(0.2)
    await first.release(answered=False)
    done, pending = await asyncio.wait(waiters, timeout=1.0)
    assert [c.result().role for c in done] == ["leader"] and len(pending) == 1
    await next(iter(done)).result().release(answered=True)
    assert (await next(iter(pending))).role == "answered"


async def test_a_dead_leader_costs_at_most_the_lease(
    replicas: list[ReplicaFlights], clean_redis: redis.Redis
) -> None:
    # A holder that stopped renewing (its process died): only the lease's own expiry frees it.
    clean_redis.set(replicas[0].lease_key("k"), "someone", px=600)
    started = time.monotonic()
    claim = await replicas[1].claim("k", wait_s=10)
    assert claim.role == "leader" and 0.3 < time.monotonic() - started < 2.0
    assert replicas[1].counters.takeovers == 1
    await claim.release(answered=False)


async def test_the_wait_is_bounded(replicas: list[ReplicaFlights]) -> None:
    first = await replicas[0].claim("k", wait_s=10)
    started = time.monotonic()
    claim = await replicas[1].claim("k", wait_s=0.8)
    assert claim.role == "alone" and 0.7 < time.monotonic() - started < 1.5
    assert replicas[1].counters.wait_timeouts == 1
    await first.release(answered=True)


async def test_keys_do_not_share_a_lease(replicas: list[ReplicaFlights]) -> None:
    a = await replicas[0].claim("a", wait_s=1)
    b = await replicas[1].claim("b", wait_s=1)
    assert a.role == b.role == "leader"
    await a.release(answered=True)
    await b.release(answered=True)


async def test_a_stale_leader_does_not_end_a_lease_taken_over(
    replicas: list[ReplicaFlights], clean_redis: redis.Redis
) -> None:
    first = await replicas[0].claim("k", wait_s=1)
    clean_redis.set(replicas[0].lease_key("k"), "another-holder", px=5000)  # as after an expiry
    await first.release(answered=True)
    assert clean_redis.get(replicas[0].lease_key("k")) == b"another-holder"


async def test_redis_down_means_alone() -> None:
    client = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    flights = ReplicaFlights(client, "test", op_timeout_s=0.5)
    started = time.monotonic()
    claim = await flights.claim("k", wait_s=10)
    assert claim.role == "alone" and time.monotonic() - started < 1.0
    assert flights.counters.unavailable == 1
    await claim.release(answered=True)  # nothing held: a no-op
    await client.aclose()
