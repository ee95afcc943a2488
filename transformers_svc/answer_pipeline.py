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

Speculation (--speculate for streamed requests, --speculate-unary for the others): when the exact
lookup misses and the predictor is warm (it answered within --speculate-warm-window-s, so a hit never
wakes one at zero), the key's generation starts at once, while the embedding, KNN and verifier run.
A miss listens to it (the stream a miss would have started, only earlier; a unary miss gathers its
pieces); a semantic hit abandons it: it is cancelled (the predictor aborts) unless identical requests
joined it, and only a wanted generation is stored.

Answers the predictor reports as another model revision's than this transformer's
--expected-model-revision (a canary: the stable transformer's misses reach both predictor
revisions) are served but not stored; a predictor that reports no revision is taken at its word.

Admission (transformers_svc/admission.py): every generation of this process, and only those (not a
hit, not a follower of a shared generation, not a peer replica's answer), is admitted before it
calls the predictor: the leader of a flight after its lease, a bypass, a speculation at its start,
the singleflight-timeout fallback. A refusal (429/503) reaches the request before its first piece,
since `_begin` awaits the decision of the generation it leads; the ticket settles to the real usage
when the generation ends, however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from cache.keys import CacheRequest, Kind, SamplingKey
from cache.lease import Claim
from cache.lookup_result import LookupResult
from cache.semantic_cache import SemanticCache
from cache.single_flight import Broadcast, SingleFlight
from semserve import stream_interval, tracing
from semserve.answer import Answer, Piece, answer_of, replay, whole_piece
from semserve.logs import get_logger
from semserve.openai_protocol import ChatPrompt, TokenPrompt
from semserve.sampling import SamplingOptions
from transformers_svc import metrics
from transformers_svc.admission import NO_TICKET, Admission, Metered, Ticket
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import Listener, RequestContext, RequestRecord, ignore

log = get_logger("semserve.transformer.cache")

Prompt = str | ChatPrompt | TokenPrompt
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

    def every(self, interval: int) -> AnswerStream:
        """The same answer in pieces of at least `interval` tokens after the first."""
        if interval <= 1:
            return self
        return AnswerStream(self.status, self.similarity, stream_interval.every(interval, self._pieces))


class Generator(Protocol):
    """The predictor as the pipeline uses it (transformers_svc/predictor_client.py)."""

    last_answered: float | None  # time.monotonic() of its last answer; None: none yet

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
        self,
        settings: TransformerSettings,
        cache: SemanticCache | None,
        predictor: Generator,
        admission: Admission | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.predictor = predictor
        self.admission = admission  # None: no limits, no fair queue
        self.model = settings.model_name
        self.flights: SingleFlight[Piece] = SingleFlight()
        self.on_outcome: Listener = ignore
        # Speculation's series exist from the start, at 0: a dashboard shows none wasted, not no data.
        for outcome in ("used", "cancelled"):
            metrics.SPECULATIONS.labels(self.model, outcome)
        metrics.SPECULATION_CANCELLED_TOKENS.labels(self.model)

    # -- the decision -------------------------------------------------------------------------------

    def mode(self, ctx: RequestContext) -> CacheMode:
        if self.cache is None or self.settings.cache_policy == "off":
            return NO_CACHE
        if ctx.sampling.reports_logprobs:
            return NO_CACHE  # entries keep no logprobs, and a hit has no tokens to report them for
        # Sampled answers are one draw of many; serving it again would fake determinism.
        deterministic = ctx.sampling.temperature == 0 or ctx.sampling.seed is not None
        if self.settings.cache_policy == "deterministic" and not deterministic:
            return NO_CACHE
        directives = ctx.cache_control
        return CacheMode(read="no-cache" not in directives, write="no-store" not in directives)

    def _mode_of(self, request: AnswerRequest) -> CacheMode:
        if isinstance(request.prompt, ChatPrompt) and request.prompt.messages[-1].role != "user":
            return NO_CACHE  # e.g. a tool result: nothing to match
        if isinstance(request.prompt, TokenPrompt):
            return NO_CACHE  # token ids: no text to key or match (this service has no tokenizer)
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
        if isinstance(prompt, TokenPrompt):
            raise TypeError("token prompts are never cached (_mode_of)")
        return self.key(request.context, request.kind, prompt)

    async def lookup(
        self, req: CacheRequest, mode: CacheMode, on_exact_miss: Callable[[], None] | None = None
    ) -> LookupResult | None:
        if self.cache is None or not mode.read:
            return None
        res = await self.cache.lookup(req, on_exact_miss)
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
        ticket = await self._admit(request)
        try:
            piece = await self.predictor.generate(request.prompt, ctx.sampling, ctx.request_id)
        except BaseException:
            ticket.settle(0, 0)  # nothing generated (a failure reports no usage)
            raise
        ticket.settle(piece.prompt_tokens, piece.completion_tokens)
        answer = answer_of([piece])
        mode = self._mode_of(request)
        if mode.write and self.storable(answer):
            await self.cache.store(self._key_of(request), answer)
        return Outcome(answer, "miss", stream.similarity)

    async def stream(self, request: AnswerRequest) -> AnswerStream:
        """The answer as pieces (hits replayed word by word, misses as the predictor makes them),
        grouped to the request's stream interval."""
        asked = request.context.sampling.stream_interval
        answer = await self._begin(request, streamed=True)
        return answer.every(stream_interval.effective(self.settings.stream_interval, asked))

    async def _begin(self, request: AnswerRequest, streamed: bool) -> AnswerStream:
        mode = self._mode_of(request)
        if self.cache is None or not mode.used:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
            return AnswerStream("bypass", None, await self._metered(request, streamed))
        key = self._key_of(request)
        speculation = self._speculation(request, key, mode, streamed)
        try:
            res = await self.lookup(key, mode, speculation.start if speculation is not None else None)
        except BaseException:
            if speculation is not None:
                speculation.abandon()
            raise
        cached = hit_answer(res)
        if res is not None and cached is not None:
            if speculation is not None:
                speculation.abandon()
            pieces = replay(cached) if streamed else [whole_piece(cached)]
            return AnswerStream(res.status, res.similarity, _listed(pieces))  # type: ignore[arg-type]
        if res is None:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
        status: CacheStatus = "miss" if res is not None else "bypass"
        similarity = res.similarity if res is not None else None
        flight = self.cache.flight_key(key)
        if flight is None:  # shares nothing (e.g. an empty prompt)
            return AnswerStream(status, similarity, await self._metered(request, streamed))
        vector = res.vector if res is not None else None
        if speculation is not None and speculation.generation is not None:
            generation, pieces, led = speculation.generation, speculation.use(vector), True
        else:
            generation = _Generation(self, key, mode, vector, self._source(request, streamed),
                                     lambda: self._admit(request))
            pieces, led = self.flights.listen(flight, generation.pieces, generation.complete, _is_last)
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

    def _speculation(
        self, request: AnswerRequest, key: CacheRequest, mode: CacheMode, streamed: bool
    ) -> _Speculation | None:
        """A speculation for this request, to start on an exact miss; None when it may not
        speculate (off, off for unary requests, no cache read, nothing to share, or a predictor not
        known to be warm)."""
        if not self.settings.speculate or not (streamed or self.settings.speculate_unary):
            return None
        if self.cache is None or not mode.read:
            return None
        last = self.predictor.last_answered
        if last is None or time.monotonic() - last > self.settings.speculate_warm_window_s:
            return None
        flight = self.cache.flight_key(key)
        if flight is None:
            return None
        return _Speculation(self, flight, key, mode, self._source(request, streamed=True),
                            lambda: self._admit(request))

    async def _admit(self, request: AnswerRequest) -> Ticket:
        """Admit one generation of `request` (its tenant's limits, the fair queue), or raise."""
        if self.admission is None:
            return NO_TICKET
        ctx = request.context
        return await self.admission.admit(ctx.tenant, request.prompt, ctx.sampling.max_tokens, ctx.request_id)

    async def _metered(self, request: AnswerRequest, streamed: bool) -> AsyncIterator[Piece]:
        """A generation of this request alone, admitted now, settled when its pieces end."""
        ticket = await self._admit(request)
        return Metered(self._source(request, streamed)(), ticket)

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


def _is_last(piece: Piece) -> bool:
    return piece.finish_reason is not None


class _Speculation:
    """A request's generation started on its exact miss, before its semantic lookup decided: the
    request listens to it on a miss (`use`) or gives it up on a hit (`abandon`)."""

    def __init__(
        self,
        pipeline: AnswerPipeline,
        flight: str,
        key: CacheRequest,
        mode: CacheMode,
        source: Callable[[], AsyncIterator[Piece]],
        admit: Callable[[], Awaitable[Ticket]],
    ) -> None:
        self.pipeline, self.flight, self.key, self.mode, self.source = pipeline, flight, key, mode, source
        self.admit = admit
        self.generation: _Generation | None = None
        self.broadcast: Broadcast[Piece] | None = None

    def start(self) -> None:
        """On the exact miss: start the key's generation, unless one runs already (the request then
        joins it after its lookup, as without speculation)."""
        flights = self.pipeline.flights
        if flights.running(self.flight):
            return
        self.generation = _Generation(self.pipeline, self.key, self.mode, None, self.source, self.admit,
                                      speculative=True)
        generation = self.generation
        self.broadcast = flights.start(self.flight, generation.pieces, generation.complete, _is_last)

    def use(self, vector: np.ndarray | None) -> AsyncIterator[Piece]:
        """The lookup missed: this is the request's generation (and its answer is stored)."""
        assert self.generation is not None and self.broadcast is not None
        self.generation.vector = vector
        self.generation.want(True)
        metrics.SPECULATIONS.labels(self.pipeline.model, "used").inc()
        return self.broadcast.listen()

    def abandon(self) -> None:
        """The lookup hit (or failed by raising): stop the generation unless identical requests,
        which joined it after their own misses, listen to it."""
        if self.generation is None or self.broadcast is None:
            return
        wanted = self.broadcast.listeners > 0
        self.generation.want(wanted)
        metrics.SPECULATIONS.labels(self.pipeline.model, "used" if wanted else "cancelled").inc()
        self.pipeline.flights.abandon(self.flight, self.broadcast)


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
        admit: Callable[[], Awaitable[Ticket]],
        speculative: bool = False,
    ) -> None:
        assert pipeline.cache is not None
        self.cache = pipeline.cache
        self.model = pipeline.model
        self.storable = pipeline.storable
        self.key, self.mode, self.vector, self.produce, self.admit = key, mode, vector, produce, admit
        self.claim = Claim("alone")
        # Whether a peer replica's stored answer is this generation's (known once the lease is).
        self.by_peer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.by_peer.add_done_callback(lambda f: f.cancelled() or f.exception())
        # Whether a request needs this generation: a speculation's is known once its lookup decided;
        # one that is not needed is never stored.
        self.wanted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not speculative:
            self.wanted.set_result(True)
        self.tokens = 0  # generated so far

    def want(self, wanted: bool) -> None:
        if not self.wanted.done():
            self.wanted.set_result(wanted)

    def _unwanted(self) -> bool:
        return self.wanted.done() and not self.wanted.result()

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
            try:
                ticket = await self.admit()  # refused: before the predictor, before any piece
            except BaseException:
                await self.claim.release(False)  # one waiting replica takes over
                raise
        except BaseException as exc:
            if not self.by_peer.done():
                self.by_peer.set_exception(exc)
            raise
        self._decided(False)
        finished = False
        last: Piece | None = None
        try:
            async for piece in self.produce():
                finished = finished or piece.finish_reason is not None
                self.tokens = piece.completion_tokens
                last = piece
                yield piece
        finally:
            ticket.settle(last.prompt_tokens if last else 0, last.completion_tokens if last else 0)
            if self._unwanted():
                metrics.SPECULATION_CANCELLED_TOKENS.labels(self.model).inc(self.tokens)
            if not finished:
                await self.claim.release(False)  # cut short: one waiting replica takes over

    async def complete(self, pieces: list[Piece]) -> None:
        if self.by_peer.done() and not self.by_peer.exception() and self.by_peer.result():
            return  # a peer's answer: stored already
        answer = answer_of(pieces)
        stored = False
        # A speculation that ran to its end before its lookup decided waits for the decision.
        if await self.wanted and self.mode.write and self.storable(answer):
            stored = await self.cache.store(self.key, answer, self.vector)
        await self.claim.release(stored)


async def _listed(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        yield piece

