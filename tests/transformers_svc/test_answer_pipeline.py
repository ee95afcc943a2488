"""The answer pipeline's single flight on a real Redis (the cache's embedder and verifier are the
tests' doubles, the predictor a counting generator): one generation for identical concurrent
requests, whose followers report `shared`; the leader's failure and cancellation; the bounded wait;
and one generation across two replicas through the lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY

from cache.entry_store import EntryStore
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings
from semserve.answer import Answer, Piece
from semserve.sampling import SamplingOptions
from semserve.tooling.local_redis import RedisServer
from tests.cache.conftest import make_settings
from tests.cache.doubles import HashingEmbedderDouble, ThresholdVerifierDouble
from transformers_svc.answer_pipeline import AnswerPipeline, AnswerRequest
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import RequestContext

Q = "What is the capital of France?"


class CountingGenerator:
    """Stands in for the predictor: `make(n)` says what the n-th call does."""

    def __init__(self, make: Callable[[int], Awaitable[str]]) -> None:
        self.make = make
        self.calls = 0
        self.last_answered: float | None = None  # never answered: the pipeline does not speculate

    async def generate(self, prompt: object, options: SamplingOptions, request_id: str) -> Piece:
        self.calls += 1
        return Piece(await self.make(self.calls), "stop", 2, 5)

    async def stream(self, prompt: object, options: SamplingOptions, request_id: str) -> AsyncIterator[Piece]:
        self.calls += 1
        text = await self.make(self.calls)
        yield Piece(text, None, 1, 5)
        yield Piece("", "stop", 2, 5)


def ask(prompt: str = Q) -> AnswerRequest:
    ctx = RequestContext("acme", "rid", "v2-rest", "/v2/models/llm/infer", frozenset(),
                         SamplingOptions(temperature=0, max_tokens=8))  # fmt: skip
    return AnswerRequest(ctx, "completion", prompt)


def pipeline(cache: SemanticCache, gen: CountingGenerator) -> AnswerPipeline:
    return AnswerPipeline(TransformerSettings(), cache, gen)


async def test_one_generation_for_identical_requests_the_others_shared(cache: SemanticCache) -> None:
    async def slow(_: int) -> str:
        await asyncio.sleep(0.2)
        return "Paris"

    gen = CountingGenerator(slow)
    p = pipeline(cache, gen)
    outcomes = await asyncio.gather(*(p.answer(ask()) for _ in range(20)))
    assert gen.calls == 1 and all(o.answer.text == "Paris" for o in outcomes)
    assert sorted(o.status for o in outcomes) == ["miss"] + ["shared"] * 19
    assert cache.counters.singleflight_leaders == 1 and cache.counters.singleflight_joined == 19
    assert (await p.answer(ask())).status == "exact"  # the leader stored it before answering
    assert not len(p.flights)


async def test_streamed_followers_are_shared_too(cache: SemanticCache) -> None:
    async def slow(_: int) -> str:
        await asyncio.sleep(0.2)
        return "Paris"

    gen = CountingGenerator(slow)
    p = pipeline(cache, gen)

    async def streamed() -> tuple[str, str]:
        s = await p.stream(ask())
        return s.status, "".join([piece.text async for piece in s])

    results = await asyncio.gather(*(streamed() for _ in range(5)), p.answer(ask()))
    texts = [r[1] if isinstance(r, tuple) else r.answer.text for r in results]
    statuses = [r[0] if isinstance(r, tuple) else r.status for r in results]
    assert gen.calls == 1 and texts == ["Paris"] * 6
    assert sorted(statuses) == ["miss"] + ["shared"] * 5


class TokenGenerator(CountingGenerator):
    """A predictor that streams 9 tokens one by one, slowly enough for followers to join."""

    def __init__(self) -> None:
        super().__init__(lambda _: asyncio.sleep(0, "Paris"))

    async def stream(self, prompt: object, options: SamplingOptions, request_id: str) -> AsyncIterator[Piece]:
        self.calls += 1
        for n in range(1, 10):
            await asyncio.sleep(0.02)
            yield Piece(f"t{n} ", "length" if n == 9 else None, n, 5)


def asking(interval: int | None) -> AnswerRequest:
    request = ask()
    sampling = SamplingOptions(temperature=0, max_tokens=8, stream_interval=interval)
    return AnswerRequest(request.context.with_sampling(sampling), request.kind, request.prompt)


async def test_requests_sharing_a_generation_each_get_their_own_stream_interval(cache: SemanticCache) -> None:
    async def sizes(p: AnswerPipeline, interval: int | None) -> tuple[str, list[int]]:
        stream = await p.stream(asking(interval))
        counts = [piece.completion_tokens async for piece in stream]
        return stream.status, [b - a for a, b in zip([0, *counts], counts, strict=False)]

    gen = TokenGenerator()
    p = pipeline(cache, gen)
    results = await asyncio.gather(sizes(p, 3), sizes(p, None), sizes(p, 1))
    assert gen.calls == 1 and sorted(r[0] for r in results) == ["miss", "shared", "shared"]
    assert [r[1] for r in results] == [[1, 3, 3, 2], [1] * 9, [1] * 9]
    # The transformer's own --stream-interval is the least; a request may only raise it.
    p2 = AnswerPipeline(TransformerSettings(stream_interval=4), None, TokenGenerator())
    assert (await sizes(p2, None))[1] == [1, 4, 4]
    assert (await sizes(p2, 2))[1] == [1, 4, 4]
    assert (await sizes(p2, 6))[1] == [1, 6, 2]


async def test_the_leaders_error_reaches_the_waiters(cache: SemanticCache) -> None:
    async def failing(_: int) -> str:
        await asyncio.sleep(0.05)
        raise RuntimeError("predictor down")

    gen = CountingGenerator(failing)
    p = pipeline(cache, gen)
    results = await asyncio.gather(*(p.answer(ask()) for _ in range(5)), return_exceptions=True)
    assert gen.calls == 1 and all(isinstance(r, RuntimeError) for r in results)
    assert (await cache.lookup(p.key(ask().context, "completion", Q))).status == "miss"
    assert not len(p.flights)


async def test_the_generation_outlives_its_leaders_cancellation(cache: SemanticCache) -> None:
    async def slow(_: int) -> str:
        await asyncio.sleep(0.1)
        return "Paris"

    gen = CountingGenerator(slow)
    p = pipeline(cache, gen)
    leader = asyncio.create_task(p.answer(ask()))
    await asyncio.sleep(0.01)
    waiters = [asyncio.create_task(p.answer(ask())) for _ in range(3)]
    await asyncio.sleep(0.01)
    leader.cancel()
    outcomes = await asyncio.gather(*waiters)
    # Still listened to: the one generation goes on for the waiters, nothing is made twice.
    assert [o.answer.text for o in outcomes] == ["Paris"] * 3 and gen.calls == 1
    assert leader.cancelled()


async def test_a_followers_wait_is_bounded(store: EntryStore, cache_settings: CacheSettings) -> None:
    cache_settings.singleflight_wait_s = 0.05
    cache = SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(), cache_settings)

    async def first_slow(n: int) -> str:
        await asyncio.sleep(0.3 if n == 1 else 0.0)
        return f"answer {n}"

    gen = CountingGenerator(first_slow)
    p = pipeline(cache, gen)
    outcomes = await asyncio.gather(*(p.answer(ask()) for _ in range(3)))
    assert gen.calls == 3 and cache.counters.singleflight_wait_timeouts == 2
    assert outcomes[0].answer.text == "answer 1"


async def test_two_replicas_on_one_redis_generate_once(redis_server: RedisServer, clean_redis: Any) -> None:
    """Two pipelines with their own caches (own clients, own flights) on one Redis: one
    generation through the lease, the other replica's request `shared`; with the lease off, each
    generates."""

    async def run(lease: bool) -> tuple[int, list[str], list[str]]:
        settings = make_settings(redis_server.url, singleflight_replicas=lease)
        caches = []
        for _ in range(2):
            s = EntryStore.from_settings(settings)
            await s.ensure_index()
            caches.append(SemanticCache(s, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings))

        async def slow(_: int) -> str:
            await asyncio.sleep(0.5)
            return "Paris."

        gen = CountingGenerator(slow)
        outcomes = await asyncio.gather(*(pipeline(c, gen).answer(ask(f"capital, lease {lease}"))
                                          for c in caches))  # fmt: skip
        for c in caches:
            await c.close()
        return gen.calls, [o.answer.text for o in outcomes], sorted(o.status for o in outcomes)

    calls, texts, statuses = await run(lease=True)
    assert calls == 1 and texts == ["Paris.", "Paris."] and statuses == ["miss", "shared"]
    calls, _, statuses = await run(lease=False)
    assert calls == 2 and statuses == ["miss", "miss"]


def speculations(p: AnswerPipeline, outcome: str) -> float:
    return (
        REGISTRY.get_sample_value("semserve_speculation_total", {"model_name": p.model, "outcome": outcome})
        or 0.0
    )


async def test_a_speculation_is_the_one_generation_of_a_streamed_burst(cache: SemanticCache) -> None:
    async def slow(_: int) -> str:
        await asyncio.sleep(0.2)
        return "Paris"

    gen = CountingGenerator(slow)
    gen.last_answered = time.monotonic()  # warm
    p = pipeline(cache, gen)
    used = speculations(p, "used")

    async def streamed() -> tuple[str, str]:
        s = await p.stream(ask("capital, speculated burst"))
        return s.status, "".join([piece.text async for piece in s])

    results = await asyncio.gather(*(streamed() for _ in range(5)))
    assert gen.calls == 1 and [r[1] for r in results] == ["Paris"] * 5
    assert sorted(r[0] for r in results) == ["miss"] + ["shared"] * 4
    assert speculations(p, "used") == used + 1
    assert (await p.answer(ask("capital, speculated burst"))).status == "exact"


class HangingGenerator(CountingGenerator):
    """Streams one token, then waits to be cancelled (and says it was)."""

    def __init__(self) -> None:
        super().__init__(lambda _: asyncio.sleep(0, "Paris"))
        self.last_answered = time.monotonic()  # warm
        self.cancelled = False

    async def stream(self, prompt: object, options: SamplingOptions, request_id: str) -> AsyncIterator[Piece]:
        self.calls += 1
        yield Piece("Paris", None, 1, 5)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        yield Piece("", "stop", 2, 5)


async def test_a_semantic_hit_cancels_the_speculation_counts_its_tokens_and_stores_nothing(
    store: EntryStore, cache_settings: CacheSettings
) -> None:
    # A slow embedding: the speculation has streamed its first token when the hit is decided.
    cache = SemanticCache(
        store, HashingEmbedderDouble(delay_s=0.2), ThresholdVerifierDouble(), cache_settings
    )
    gen = HangingGenerator()
    p = pipeline(cache, gen)
    stored, paraphrase = "what is the capital of spain", "what is the capital of spain please"
    assert await cache.store(p.key(ask().context, "completion", stored), Answer("Madrid.", "stop", 2, 5))
    cancelled, tokens = speculations(p, "cancelled"), REGISTRY.get_sample_value(
        "semserve_speculation_cancelled_tokens_total", {"model_name": p.model}) or 0.0  # fmt: skip
    s = await p.stream(ask(paraphrase))
    assert s.status == "semantic" and "".join([piece.text async for piece in s]) == "Madrid."
    await asyncio.sleep(0.05)
    assert gen.calls == 1 and gen.cancelled and not len(p.flights)
    assert speculations(p, "cancelled") == cancelled + 1
    assert REGISTRY.get_sample_value(
        "semserve_speculation_cancelled_tokens_total", {"model_name": p.model}) == tokens + 1  # fmt: skip
    # Nothing of the cancelled stream was stored under the paraphrase's key.
    assert (await cache.lookup(p.key(ask().context, "completion", paraphrase))).status == "semantic"



async def test_a_speculation_waits_for_its_lease_so_a_peers_generation_is_the_one_call(
    redis_server: RedisServer, clean_redis: Any
) -> None:
    """Replica A generates a key (it holds the lease); replica B's streamed miss on the same key
    speculates, and its speculation takes the lease before it calls the predictor: B serves A's
    answer (`shared`) and never calls. (Calling first and taking the lease meanwhile took ~1.4 ms
    off a streamed miss's first token on a busy core, but made a burst over R replicas R calls:
    bench/RESULTS.md, "Stop 40".)"""
    settings = make_settings(redis_server.url)
    caches = []
    for _ in range(2):
        s = EntryStore.from_settings(settings)
        await s.ensure_index()
        caches.append(SemanticCache(s, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings))
    release = asyncio.Event()

    async def held(_: int) -> str:
        await release.wait()
        return "Paris."

    leader, speculating = CountingGenerator(held), CountingGenerator(held)
    speculating.last_answered = time.monotonic()  # warm: B's streamed miss speculates
    prompt = "capital, a speculation beside a peer's lease"
    first = asyncio.ensure_future(pipeline(caches[0], leader).answer(ask(prompt)))
    for _ in range(300):  # until A holds the lease and generates
        if leader.calls:
            break
        await asyncio.sleep(0.01)
    used = speculations(pipeline(caches[1], speculating), "used")
    second = asyncio.ensure_future(pipeline(caches[1], speculating).stream(ask(prompt)))
    await asyncio.sleep(0.3)  # B's lookup has missed and its speculation waits on the lease
    assert not second.done() and speculating.calls == 0
    release.set()
    s = await second
    assert s.status == "shared" and "".join([piece.text async for piece in s]) == "Paris."
    assert (await first).answer.text == "Paris."
    assert speculating.calls == 0 and leader.calls == 1
    assert speculations(pipeline(caches[1], speculating), "used") == used + 1  # it did speculate
    for c in caches:
        await c.close()
