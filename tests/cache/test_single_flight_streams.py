"""Single flight for streamed generations (cache/single_flight.py), with a source stream that
stands in for the predictor: listeners replay from the start, the last one to leave cancels it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cache.single_flight import SingleFlight


class Source:
    """A generation whose pieces the test releases one by one."""

    def __init__(self) -> None:
        self.gate: asyncio.Queue[str | None] = asyncio.Queue()
        self.starts = 0
        self.cancelled = False

    def start(self) -> AsyncIterator[str]:
        self.starts += 1
        return self._run()

    async def _run(self) -> AsyncIterator[str]:
        try:
            while (item := await self.gate.get()) is not None:
                yield item
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def _collect(stream: AsyncIterator[str]) -> list[str]:
    return [item async for item in stream]


async def test_followers_share_one_generation_from_its_start() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    stored: list[list[str]] = []

    async def store(items: list[str]) -> None:
        stored.append(list(items))

    first, started = shared.listen("k", source.start, store)
    leader = asyncio.ensure_future(_collect(first))
    await source.gate.put("a")
    await asyncio.sleep(0.01)
    second, started_again = shared.listen("k", source.start, store)
    follower = asyncio.ensure_future(_collect(second))
    for item in ("b", "c", None):
        await source.gate.put(item)
    assert await leader == ["a", "b", "c"] and await follower == ["a", "b", "c"]
    assert started and not started_again and source.starts == 1
    assert stored == [["a", "b", "c"]] and len(shared) == 0


async def test_a_listener_leaving_does_not_stop_the_others() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    quitter, _ = shared.listen("k", source.start, _nothing)
    stayer, _ = shared.listen("k", source.start, _nothing)
    staying = asyncio.ensure_future(_collect(stayer))
    await source.gate.put("a")
    assert await anext(quitter) == "a"
    await quitter.aclose()  # type: ignore[attr-defined]
    await source.gate.put("b")
    await source.gate.put(None)
    assert await staying == ["a", "b"] and not source.cancelled


async def test_the_last_listener_leaving_cancels_the_generation_and_stores_nothing() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    stored: list[list[str]] = []

    async def store(items: list[str]) -> None:
        stored.append(items)

    only, _ = shared.listen("k", source.start, store)
    await source.gate.put("a")
    assert await anext(only) == "a"
    await only.aclose()  # type: ignore[attr-defined]
    await asyncio.sleep(0.01)
    assert source.cancelled and stored == [] and len(shared) == 0
    # The next request of the key starts a generation of its own.
    again, started = shared.listen("k", source.start, store)
    assert started and source.starts == 2
    await again.aclose()  # type: ignore[attr-defined]


async def test_a_failed_generation_fails_every_listener() -> None:
    shared: SingleFlight[str] = SingleFlight()

    async def broken() -> AsyncIterator[str]:
        yield "a"
        raise RuntimeError("predictor died")

    one, _ = shared.listen("k", broken, _nothing)
    two, _ = shared.listen("k", broken, _nothing)
    for stream in (one, two):
        with pytest.raises(RuntimeError, match="predictor died"):
            await _collect(stream)


async def _nothing(_: list[str]) -> None:
    return None


async def test_leaving_after_the_last_item_does_not_cancel_and_the_answer_is_stored() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    stored: list[list[str]] = []

    async def store(items: list[str]) -> None:
        stored.append(items)

    only, _ = shared.listen("k", source.start, store, is_last=lambda item: item == "end")
    for item in ("a", "end"):
        await source.gate.put(item)
    assert [await anext(only), await anext(only)] == ["a", "end"]
    await only.aclose()  # type: ignore[attr-defined]
    await source.gate.put(None)  # the source closes a moment after its last item
    await asyncio.sleep(0.01)
    assert not source.cancelled and stored == [["a", "end"]]


async def test_a_started_generation_nobody_listens_to_is_abandoned_unstored_and_forgotten() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    stored: list[list[str]] = []

    async def store(items: list[str]) -> None:
        stored.append(items)

    broadcast = shared.start("k", source.start, store)
    assert shared.running("k")
    await source.gate.put("a")
    await asyncio.sleep(0.01)
    shared.abandon("k", broadcast)
    await asyncio.sleep(0.01)
    assert source.cancelled and stored == [] and not shared.running("k")
    again, started = shared.listen("k", source.start, store)
    assert started and source.starts == 2
    await again.aclose()  # type: ignore[attr-defined]


async def test_an_abandoned_generation_runs_on_for_a_listener_that_has_not_read_yet() -> None:
    shared: SingleFlight[str] = SingleFlight()
    source = Source()
    broadcast = shared.start("k", source.start, _nothing)
    follower, started = shared.listen("k", source.start, _nothing)
    assert not started
    shared.abandon("k", broadcast)  # the follower joined before its first read: it counts
    for item in ("a", "b", None):
        await source.gate.put(item)
    assert await _collect(follower) == ["a", "b"] and not source.cancelled and source.starts == 1
