"""SingleFlight with unary generations (one item each, as the transformer drives whole answers):
one produce per key, the leader's failure and cancellation, and the store before the answer
(no Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from cache.single_flight import SingleFlight


def one(produce: Callable[[], Awaitable[str]]) -> Callable[[], AsyncIterator[str]]:
    async def source() -> AsyncIterator[str]:
        yield await produce()

    return source


async def run(flight: SingleFlight[str], key: str, produce: Callable[[], Awaitable[str]],
              store: Callable[[list[str]], Awaitable[None]] | None = None) -> str:
    async def nothing(_: list[str]) -> None:
        return None

    stream, _ = flight.listen(key, one(produce), store or nothing, is_last=lambda _: True)
    [answer] = [item async for item in stream]
    return answer


async def test_one_produce_and_one_store_for_concurrent_callers() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls: list[int] = []
    stored: list[list[str]] = []

    async def produce() -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        return "answer"

    async def store(items: list[str]) -> None:
        stored.append(items)

    answers = await asyncio.gather(*[run(flight, "k", produce, store) for _ in range(10)])
    assert answers == ["answer"] * 10 and len(calls) == 1 and stored == [["answer"]]
    assert flight.started == 1 and flight.joined == 9
    assert not len(flight)


async def test_the_answer_goes_out_only_once_it_is_stored() -> None:
    """Read-your-writes: no listener gets the last item before `on_complete` has finished."""
    flight: SingleFlight[str] = SingleFlight()
    events: list[str] = []

    async def produce() -> str:
        return "answer"

    async def store(items: list[str]) -> None:
        await asyncio.sleep(0.05)
        events.append("stored")

    async def client() -> None:
        await run(flight, "k", produce, store)
        events.append("answered")

    await asyncio.gather(client(), client())
    assert events == ["stored", "answered", "answered"]


async def test_waiters_share_the_leaders_exception_and_outlive_its_cancellation() -> None:
    flight: SingleFlight[str] = SingleFlight()
    gate = asyncio.Event()

    async def failing() -> str:
        await gate.wait()
        raise RuntimeError("predictor down")

    leader = asyncio.create_task(run(flight, "k", failing))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(run(flight, "k", failing))
    await asyncio.sleep(0.01)
    gate.set()
    for task in (leader, waiter):
        with pytest.raises(RuntimeError, match="predictor down"):
            await task

    calls: list[int] = []

    async def slow() -> str:
        calls.append(1)
        await asyncio.sleep(0.1)
        return "made once"

    leader = asyncio.create_task(run(flight, "c", slow))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(run(flight, "c", slow))
    await asyncio.sleep(0.01)
    leader.cancel()
    # The generation goes on while anybody listens: the waiter gets it, nothing is made twice.
    assert await waiter == "made once" and calls == [1]
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert not len(flight)
