"""The one path every request takes, whatever its protocol: decide exact / semantic / miss / bypass,
generate once for identical concurrent misses (in this process and across replicas), store complete
answers before they are answered, and report how each request ended (metrics, request log).

The protocol edges (model.py: v2 REST, gRPC, generate routes; openai_backend.py: OpenAI) only parse,
build an AnswerRequest, call `answer` or `stream`, and format what comes back.

Single flight is one mechanism (cache/single_flight.py): a generation is a stream of pieces that
every identical request listens to; a unary request is a generation of one piece. The leader of a
generation in this process first takes the replicas' lease (cache/lease.py): another replica's
stored answer then comes as the one piece. A request answered by another request's generation
reports `shared`.

Read-your-writes: a generation's last piece reaches its listeners only after the answer is stored
and the lease released (Broadcast's `on_complete`), so no response (nor a stream's final chunk)
ends before a request through any replica can read the answer.

Answers the predictor reports as another model revision's than this transformer's
--expected-model-revision (a canary: the stable transformer's misses reach both predictor
revisions) are served but not stored; a predictor that reports no revision is taken at its word.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from cache.keys import CacheRequest, Kind, SamplingKey
from cache.lease import Claim
from cache.lookup_result import LookupResult
from cache.semantic_cache import SemanticCache
from cache.single_flight import SingleFlight
from semserve import tracing
from semserve.answer import Answer, Piece, answer_of, replay, whole_piece
from semserve.logs import get_logger
from semserve.openai_protocol import ChatPrompt
from semserve.sampling import SamplingOptions
from transformers_svc import metrics
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import Listener, RequestContext, RequestRecord, ignore

log = get_logger("semserve.transformer.cache")

Prompt = str | ChatPrompt
# What a request's answer came from: the cache (exact, semantic), this request's own generation
# (miss; bypass when it could not use the cache), or another request's generation (shared).
CacheStatus = Literal["exact", "semantic", "miss", "bypass", "shared"]
SERVED = ("exact", "semantic")  # the statuses of an answer served from the cache


@dataclass(frozen=True)
class CacheMode:
    """How one request may use the cache: read (look up, be served) and write (have its answer
    kept)."""

    read: bool
    write: bool

    @property
    def used(self) -> bool:
        return self.read or self.write


NO_CACHE = CacheMode(False, False)


@dataclass(frozen=True)
class AnswerRequest:
    """One prompt to answer. `context` carries tenant, request id, protocol, sampling and the
    Cache-Control directives; `prompt` is a raw completion prompt or a chat."""

    context: RequestContext
    kind: Kind  # "completion" or "chat"
    prompt: Prompt


@dataclass(frozen=True)
class Outcome:
    answer: Answer
    status: CacheStatus
    similarity: float | None  # of the entry served; for a miss, of the nearest one rejected


class AnswerStream:
    """The pieces of one answer, with its cache status known before the first (for headers)."""

    def __init__(self, status: CacheStatus, similarity: float | None, pieces: AsyncIterator[Piece]) -> None:
        self.status = status
        self.similarity = similarity
        self._pieces = pieces

    def __aiter__(self) -> AnswerStream:
        return self

    async def __anext__(self) -> Piece:
        return await anext(self._pieces)

    async def aclose(self) -> None:
        await self._pieces.aclose()  # type: ignore[attr-defined]


class Generator(Protocol):
    """The predictor as the pipeline uses it (transformers_svc/predictor_client.py)."""

    async def generate(self, prompt: Prompt, options: SamplingOptions, request_id: str) -> Piece: ...

    def stream(self, prompt: Prompt, options: SamplingOptions, request_id: str) -> AsyncIterator[Piece]: ...


def hit_answer(res: LookupResult | None) -> Answer | None:
    """The answer a lookup found to serve, or None (a miss, a bypass, or an entry that holds no
    answer: something else wrote under this key)."""
    if res is None or not res.hit or not isinstance(res.answer, Answer):
        return None
    return res.answer


class AnswerPipeline:
    def __init__(
        self, settings: TransformerSettings, cache: SemanticCache | None, predictor: Generator
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.predictor = predictor
        self.model = settings.model_name
        self.flights: SingleFlight[Piece] = SingleFlight()
        self.on_outcome: Listener = ignore

    # -- the decision -------------------------------------------------------------------------------

    def mode(self, ctx: RequestContext) -> CacheMode:
        if self.cache is None or self.settings.cache_policy == "off":
            return NO_CACHE
        # Sampled answers are one draw of many; serving it again would fake determinism.
        deterministic = ctx.sampling.temperature == 0 or ctx.sampling.seed is not None
        if self.settings.cache_policy == "deterministic" and not deterministic:
            return NO_CACHE
        directives = ctx.cache_control
        return CacheMode(read="no-cache" not in directives, write="no-store" not in directives)

    def _mode_of(self, request: AnswerRequest) -> CacheMode:
        if isinstance(request.prompt, ChatPrompt) and request.prompt.messages[-1].role != "user":
            return NO_CACHE  # e.g. a tool result: nothing to match
        return self.mode(request.context)

    def key(self, ctx: RequestContext, kind: Kind, prompt: str, context: object = None) -> CacheRequest:
        """The cache key: `prompt` is matched semantically, `context` (JSON-able) exactly."""
        return CacheRequest(
            tenant=ctx.tenant,
            model=self.model,
            kind=kind,
            prompt=prompt,
            context=context,
            sampling=SamplingKey.from_options(ctx.sampling),
            model_revision=self.settings.expected_model_revision or None,
        )

    def _key_of(self, request: AnswerRequest) -> CacheRequest:
        prompt = request.prompt
        if isinstance(prompt, ChatPrompt):
            # Only the last user message is matched semantically; everything before it, and
            # whatever else shapes the answer, is part of the key.
            return self.key(request.context, "chat", prompt.last_text, prompt.context())
        return self.key(request.context, request.kind, prompt)

    async def lookup(self, req: CacheRequest, mode: CacheMode) -> LookupResult | None:
        if self.cache is None or not mode.read:
            return None
        res = await self.cache.lookup(req)
        metrics.LOOKUPS.labels(self.model, res.status).inc()
        metrics.LOOKUP_SECONDS.labels(self.model).observe(res.timings.get("total", 0.0) / 1000)
        if "embed" in res.timings:
            metrics.EMBED_SECONDS.labels(self.model).observe(res.timings["embed"] / 1000)
        if res.similarity is not None and res.status in ("semantic", "miss") and res.candidates:
            decision = "served" if res.status == "semantic" else "rejected"
            metrics.SIMILARITY.labels(self.model, decision).observe(res.similarity)
        if res.hit:
            metrics.PREDICTOR_CALLS_SAVED.labels(self.model).inc()
        if res.verdict is not None:
            log.debug(
                "cache_decision",
                status=res.status,
                rule=res.verdict.rule,
                score=round(res.verdict.score, 4),
                similarity=None if res.similarity is None else round(res.similarity, 4),
                # The verdict's detail quotes prompt words; only --record-prompt-text may keep them.
                detail=res.verdict.detail if self.settings.record_prompt_text else None,
            )
        return res

    # -- the two calls ------------------------------------------------------------------------------

    async def answer(self, request: AnswerRequest) -> Outcome:
        """The whole answer: from the cache, or from one generation shared by identical requests.
        A follower waits at most `singleflight_wait_s` for the generation, then makes its own."""
        stream = await self._begin(request, streamed=False)
        if stream.status != "shared" or self.cache is None:
            return Outcome(answer_of([p async for p in stream]), stream.status, stream.similarity)
        with tracing.span("semserve.cache.singleflight.wait") as span:
            try:
                async with asyncio.timeout(self.cache.settings.singleflight_wait_s):
                    pieces = [p async for p in stream]
                span.set_attribute("semserve.cache.singleflight.outcome", "shared")
                return Outcome(answer_of(pieces), "shared", stream.similarity)
            except TimeoutError:
                self.cache.counters.singleflight_wait_timeouts += 1
                span.set_attribute("semserve.cache.singleflight.outcome", "timeout")
            finally:
                await stream.aclose()
        # Out of the wait span: the request's own predictor call is not part of the wait.
        ctx = request.context
        answer = answer_of([await self.predictor.generate(request.prompt, ctx.sampling, ctx.request_id)])
        mode = self._mode_of(request)
        if mode.write and self.storable(answer):
            await self.cache.store(self._key_of(request), answer)
        return Outcome(answer, "miss", stream.similarity)

    async def stream(self, request: AnswerRequest) -> AnswerStream:
        """The answer as pieces (hits replayed word by word, misses as the predictor makes them)."""
        return await self._begin(request, streamed=True)

    async def _begin(self, request: AnswerRequest, streamed: bool) -> AnswerStream:
        mode, key = self._mode_of(request), self._key_of(request)
        if self.cache is None or not mode.used:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
            return AnswerStream("bypass", None, self._source(request, streamed)())
        res = await self.lookup(key, mode)
        cached = hit_answer(res)
        if res is not None and cached is not None:
            pieces = replay(cached) if streamed else [whole_piece(cached)]
            return AnswerStream(res.status, res.similarity, _listed(pieces))  # type: ignore[arg-type]
        if res is None:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
        status: CacheStatus = "miss" if res is not None else "bypass"
        similarity = res.similarity if res is not None else None
        flight = self.cache.flight_key(key)
        if flight is None:  # shares nothing (e.g. an empty prompt)
            return AnswerStream(status, similarity, self._source(request, streamed)())
        generation = _Generation(self, key, mode, res.vector if res is not None else None,
                                 self._source(request, streamed))  # fmt: skip
        pieces, led = self.flights.listen(
            flight, generation.pieces, generation.complete, lambda p: p.finish_reason is not None
        )
        if not led:
            self.cache.counters.singleflight_joined += 1
            metrics.PREDICTOR_CALLS_SAVED.labels(self.model).inc()
            return AnswerStream("shared", similarity, pieces)
        self.cache.counters.singleflight_leaders += 1
        try:
            by_peer = await generation.by_peer  # the lease decided: a peer's answer, or our own
        except BaseException:
            await pieces.aclose()  # type: ignore[attr-defined]
            raise
        if by_peer:
            metrics.PREDICTOR_CALLS_SAVED.labels(self.model).inc()
        return AnswerStream("shared" if by_peer else status, similarity, pieces)

    def _source(self, request: AnswerRequest, streamed: bool) -> Callable[[], AsyncIterator[Piece]]:
        ctx = request.context
        if streamed:
            return lambda: self.predictor.stream(request.prompt, ctx.sampling, ctx.request_id)

        async def whole() -> AsyncIterator[Piece]:
            yield await self.predictor.generate(request.prompt, ctx.sampling, ctx.request_id)

        return whole

    def storable(self, answer: Answer) -> bool:
        """A complete answer, not produced by another model revision than this transformer's."""
        if not answer.complete:
            return False
        own, got = self.settings.expected_model_revision, answer.model_revision
        if own and got and got != own:
            metrics.STORE_SKIPPED.labels(self.model, "revision_mismatch").inc()
            log.debug("cache_store_skipped", reason="revision_mismatch", revision=got, expected=own)
            return False
        return True

    # -- what is reported ---------------------------------------------------------------------------

    def report(self, record: RequestRecord) -> None:
        """How a request ended: its duration by cache status (when answered) and the request log."""
        if record.status == 200:
            tracing.annotate(semserve__cache__status=",".join(record.cache))
            for status in dict.fromkeys(record.cache):
                metrics.REQUEST_SECONDS.labels(self.model, record.context.protocol, status).observe(
                    record.context.seconds()
                )
        self.on_outcome(record)


class _Generation:
    """One generation of a key in this process: its source, its lease across replicas, and the
    store of its answer (`complete`, run by the Broadcast before the last piece goes out)."""

    def __init__(
        self,
        pipeline: AnswerPipeline,
        key: CacheRequest,
        mode: CacheMode,
        vector: np.ndarray | None,
        produce: Callable[[], AsyncIterator[Piece]],
    ) -> None:
        assert pipeline.cache is not None
        self.cache = pipeline.cache
        self.storable = pipeline.storable
        self.key, self.mode, self.vector, self.produce = key, mode, vector, produce
        self.claim = Claim("alone")
        # Whether a peer replica's stored answer is this generation's (known once the lease is).
        self.by_peer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.by_peer.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _decided(self, by_peer: bool) -> None:
        if not self.by_peer.done():
            self.by_peer.set_result(by_peer)

    async def pieces(self) -> AsyncIterator[Piece]:
        try:
            # A peer's answer is a cached one: only for requests that may be served from the cache.
            if self.mode.read and self.mode.write:
                self.claim = await self.cache.claim_replicas(self.key)
            if self.claim.role == "answered":
                shared = await self.cache.peer_answer(self.key)
                if isinstance(shared, Answer) and shared.complete:
                    self._decided(True)
                    yield whole_piece(shared)
                    return
        except BaseException as exc:
            if not self.by_peer.done():
                self.by_peer.set_exception(exc)
            raise
        self._decided(False)
        finished = False
        try:
            async for piece in self.produce():
                finished = finished or piece.finish_reason is not None
                yield piece
        finally:
            if not finished:
                await self.claim.release(False)  # cut short: one waiting replica takes over

    async def complete(self, pieces: list[Piece]) -> None:
        if self.by_peer.done() and not self.by_peer.exception() and self.by_peer.result():
            return  # a peer's answer: stored already
        answer = answer_of(pieces)
        stored = False
        if self.mode.write and self.storable(answer):
            stored = await self.cache.store(self.key, answer, self.vector)
        await self.claim.release(stored)


async def _listed(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        yield piece

