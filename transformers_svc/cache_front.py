"""The cache in front of the predictor, protocol-free: decide whether a request may use the cache,
build its cache key, answer from the cache or from the predictor (once for identical misses), and
store complete answers.

Answers are semserve.answer.Answer (text, finish reason, token counts, the model revision that made
it): v2 and OpenAI completions (both: a raw prompt in, text out) share entries; chat has its own kind.

An answer the predictor says was produced by another model revision than this transformer's
--model-revision (during a canary the stable transformer's misses reach both predictor revisions)
is served but not stored. A predictor that reports no revision is taken at its word (stored), as is
any answer when the transformer has no revision of its own.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cache.keys import CacheRequest, Kind, SamplingParams
from cache.lease import Claim
from cache.policy import LookupResult, SemanticCache
from semserve.answer import Answer, Piece
from semserve.logs import get_logger
from transformers_svc import metrics
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import RequestContext
from transformers_svc.shared_streams import SharedStreams

log = get_logger("semserve.transformer.cache")


@dataclass(frozen=True)
class CacheMode:
    lookup: bool
    store: bool

    @property
    def used(self) -> bool:
        return self.lookup or self.store


NO_CACHE = CacheMode(False, False)


@dataclass
class Outcome:
    answer: Answer
    status: str  # exact | semantic | miss | bypass
    similarity: float | None


SERVED = ("exact", "semantic")  # the cache statuses of an answer served from the cache
# Replayed hits arrive as word-sized pieces, like a generation would.
_PIECES = re.compile(r"\S+\s*|\s+")


def replay(answer: Answer) -> list[Piece]:
    """A cached answer as the pieces of a generation; the last carries the finish reason and counts."""
    texts = _PIECES.findall(answer.text) or [""]
    last = len(texts) - 1
    return [
        Piece(
            text=t,
            finish_reason=answer.finish_reason if i == last else None,
            completion_tokens=answer.completion_tokens if i == last else 0,
            prompt_tokens=answer.prompt_tokens,
            model_revision=answer.model_revision,
        )
        for i, t in enumerate(texts)
    ]


def answer_of(pieces: list[Piece]) -> Answer:
    """The answer a generation made: its pieces joined, the last one's counts and finish reason
    ("" when it never finished, which is not `complete`)."""
    last = pieces[-1] if pieces else None
    return Answer(
        text="".join(p.text for p in pieces),
        finish_reason=(last.finish_reason if last else None) or "",
        completion_tokens=last.completion_tokens if last else 0,
        prompt_tokens=max((p.prompt_tokens for p in pieces), default=0),
        model_revision=next((p.model_revision for p in pieces if p.model_revision), None),
    )


def hit_answer(res: LookupResult | None) -> Answer | None:
    """The answer a lookup found to serve, or None (a miss, a bypass, or an entry that holds no
    answer: something else wrote under this key)."""
    if res is None or not res.hit or not isinstance(res.answer, Answer):
        return None
    return res.answer


class CacheFront:
    def __init__(self, settings: TransformerSettings, cache: SemanticCache | None) -> None:
        self.settings = settings
        self.cache = cache
        self.model = settings.model_name
        self.streams: SharedStreams[Piece] = SharedStreams()

    def mode(self, ctx: RequestContext) -> CacheMode:
        if self.cache is None or self.settings.cache_policy == "off":
            return NO_CACHE
        # Sampled answers are one draw of many; serving it again would fake determinism.
        deterministic = ctx.sampling.temperature == 0 or ctx.sampling.seed is not None
        if self.settings.cache_policy == "deterministic" and not deterministic:
            return NO_CACHE
        directives = ctx.cache_control
        return CacheMode(lookup="no-cache" not in directives, store="no-store" not in directives)

    def key(self, ctx: RequestContext, kind: Kind, prompt: str, context: Any = None) -> CacheRequest:
        """The cache key: `prompt` is matched semantically, `context` (JSON-able) exactly."""
        return CacheRequest(
            tenant=ctx.tenant,
            model=self.model,
            kind=kind,
            prompt=prompt,
            context=context,
            sampling=SamplingParams.from_options(ctx.sampling),
            model_revision=self.settings.model_revision or None,
        )

    async def lookup(self, req: CacheRequest, mode: CacheMode) -> LookupResult | None:
        if self.cache is None or not mode.lookup:
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

    async def answer(
        self, req: CacheRequest, mode: CacheMode, produce: Callable[[], Awaitable[Answer]]
    ) -> Outcome:
        """Cached answer, or the predictor's (one call for identical concurrent misses)."""
        if self.cache is None or not mode.used:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
            return Outcome(await produce(), "bypass", None)
        res = await self.lookup(req, mode)
        cached = hit_answer(res)
        if res is not None and cached is not None:
            return Outcome(cached, res.status, res.similarity)
        if res is None:
            metrics.LOOKUPS.labels(self.model, "bypass").inc()
        answer = await self.cache.run_once(
            req,
            produce,
            vector=res.vector if res is not None else None,
            should_store=self.storable,
            store=mode.store,
            replicas=mode.lookup,
        )
        status = "miss" if res is not None else "bypass"
        return Outcome(answer, status, res.similarity if res is not None else None)

    def stream_miss(
        self,
        req: CacheRequest,
        mode: CacheMode,
        res: LookupResult | None,
        start: Callable[[], AsyncIterator[Piece]],
    ) -> AsyncIterator[Piece]:
        """The predictor's stream for a miss, shared by identical concurrent streaming misses
        (transformers_svc/shared_streams.py); a clean end is stored once, by the generation."""
        key = self.cache.flight_key(req) if self.cache is not None and mode.used else None
        if key is None:
            return start()
        vector = res.vector if res is not None else None
        claims: list[Claim] = []  # the cross-replica lease of this generation, once it starts

        async def on_complete(pieces: list[Piece]) -> None:
            claim = claims[0] if claims else Claim("alone")
            answer = answer_of(pieces)
            if claim.role != "answered" and self.cache is not None and mode.store and self.storable(answer):
                await claim.release(await self.cache.store(req, answer, vector))
            await claim.release(False)

        def across_replicas() -> AsyncIterator[Piece]:
            return self._replica_stream(req, mode, start, claims)

        stream, started = self.streams.listen(
            key, across_replicas, on_complete, lambda p: p.finish_reason is not None
        )
        if self.cache is not None:
            if started:
                self.cache.counters.singleflight_leaders += 1
            else:
                self.cache.counters.singleflight_joined += 1
        return stream

    async def _replica_stream(
        self,
        req: CacheRequest,
        mode: CacheMode,
        start: Callable[[], AsyncIterator[Piece]],
        claims: list[Claim],
    ) -> AsyncIterator[Piece]:
        """This process's generation of a streaming miss, shared with the other replicas through
        the cache's lease: another replica's stored answer comes as one piece; else the
        predictor's stream (the lease is released by `on_complete` once stored, or here if cut)."""
        assert self.cache is not None
        # A peer's answer is a cached one: only for requests that may be served from the cache.
        claim = await self.cache.claim_replicas(req) if mode.store and mode.lookup else Claim("alone")
        claims.append(claim)
        if claim.role == "answered":
            shared = await self.cache.peer_answer(req)
            if isinstance(shared, Answer) and shared.complete:
                yield Piece(shared.text, shared.finish_reason, shared.completion_tokens,
                            shared.prompt_tokens, shared.model_revision)  # fmt: skip
                return
        finished = False
        try:
            async for piece in start():
                finished = finished or piece.finish_reason is not None
                yield piece
        finally:
            if not finished:
                await claim.release(False)  # cut short: one waiting replica takes over

    async def store(self, req: CacheRequest, mode: CacheMode, answer: Answer, vector: Any = None) -> None:
        if self.cache is not None and mode.store and self.storable(answer):
            await self.cache.store(req, answer, vector)

    def storable(self, answer: Answer) -> bool:
        """A complete answer, not produced by another model revision than this transformer's."""
        if not answer.complete:
            return False
        own, got = self.settings.model_revision, answer.model_revision
        if own and got and got != own:
            metrics.STORE_SKIPPED.labels(self.model, "revision_mismatch").inc()
            log.debug("cache_store_skipped", reason="revision_mismatch", revision=got, expected=own)
            return False
        return True

