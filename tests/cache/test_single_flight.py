"""SingleFlight on its own: one produce per key, the leader's failure and cancellation (no Redis)."""

from __future__ import annotations

import asyncio

import pytest

from cache.counters import CacheCounters
from cache.lease import Claim
from cache.settings import CacheSettings
from cache.single_flight import SingleFlight


async def no_peer() -> None:
    return None


def make_flight(wait_s: float = 5.0) -> SingleFlight:
    return SingleFlight(CacheCounters(), CacheSettings(singleflight_wait_s=wait_s))


async def test_one_produce_and_one_store_for_concurrent_callers() -> None:
    flight, calls, stored = make_flight(), [], []

    async def produce() -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        return "answer"

    async def store(answer: str) -> bool:
        stored.append(answer)
        return True

    answers = await asyncio.gather(
        *[flight.run("k", produce, claim=None, peer_answer=no_peer, store=store) for _ in range(10)]
    )
    assert answers == ["answer"] * 10 and len(calls) == 1 and stored == ["answer"]
    assert flight.counters.singleflight_leaders == 1 and flight.counters.singleflight_joined == 9
    assert not flight.flights


async def test_a_peer_answer_is_served_and_not_stored_again() -> None:
    flight = make_flight()

    async def claim() -> Claim:
        return Claim("answered")

    async def peer() -> str:
        return "from a peer"

    async def produce() -> str:
        raise AssertionError("a peer answered: no generation")

    async def store(answer: str) -> bool:
        raise AssertionError("a peer's answer is already stored")

    assert await flight.run("k", produce, claim=claim, peer_answer=peer, store=store) == "from a peer"


async def test_waiters_share_the_leaders_exception_and_survive_its_cancellation() -> None:
    flight = make_flight()
    gate = asyncio.Event()

    async def failing() -> str:
        await gate.wait()
        raise RuntimeError("predictor down")

    leader = asyncio.create_task(flight.run("k", failing, claim=None, peer_answer=no_peer, store=None))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(flight.run("k", failing, claim=None, peer_answer=no_peer, store=None))
    await asyncio.sleep(0.01)
    gate.set()
    for task in (leader, waiter):
        with pytest.raises(RuntimeError, match="predictor down"):
            await task

    async def slow() -> str:
        await asyncio.sleep(10)
        return "never"

    async def quick() -> str:
        return "taken over"

    leader = asyncio.create_task(flight.run("c", slow, claim=None, peer_answer=no_peer, store=None))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(flight.run("c", quick, claim=None, peer_answer=no_peer, store=None))
    await asyncio.sleep(0.01)
    leader.cancel()
    assert await waiter == "taken over"  # a new flight, the waiter leads it
    assert not flight.flights
