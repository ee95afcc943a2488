"""OpenAI completions and chat through the cache. Misses go to the predictor over gRPC like every
other miss (chats as the `chat` input: the predictor applies the chat template), so they work where
only its gRPC port is routed (Knative). Streaming misses are streamed through as the predictor's
pieces arrive, shared by identical concurrent misses, and stored only after a clean end; streaming
hits are replayed as SSE chunks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from cache.keys import CacheRequest
from semserve import openai_protocol as oa
from semserve import tracing
from semserve.errors import BadRequest, NotFound
from semserve.openai_routes import RequestContext
from semserve.sampling import SamplingOptions
from transformers_svc import metrics
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.front import Answer, CacheFront, CacheMode, Outcome, Timer, answer_of
from transformers_svc.model import SERVED, replay
from transformers_svc.upstream import Piece, PredictorClient, Prompt


def _cache_headers(ctx: RequestContext, status: str, similarity: float | None) -> None:
    ctx.response_headers["x-semserve-cache"] = status
    if similarity is None:
        return
    # A miss names the similarity of the entry it rejected as such, not as the answer's.
    served = all(s in SERVED for s in status.split(","))
    name = "x-semserve-cache-similarity" if served else "x-semserve-cache-rejected-similarity"
    ctx.response_headers[name] = f"{similarity:.4f}"


class TransformerOpenAI:
    def __init__(self, settings: TransformerSettings, front: CacheFront, predictor: PredictorClient) -> None:
        self.settings = settings
        self.front = front
        self.predictor = predictor
        self.name = settings.model_name
        # OpenAI's `created` of the model card: when this server started serving it.
        self.created = int(time.time())

    def models(self) -> list[oa.OpenAIModelCard]:
        return [oa.model_card(self.name, self.created)]

    def _check(self, model: str) -> str:
        tenant = tenant_var.get() or self.settings.tenant
        tracing.annotate(semserve__protocol="openai", semserve__tenant=tenant, gen_ai__request__model=model)
        if model != self.name:
            raise NotFound(f"model {model!r} not found; this server serves {self.name!r}", "model")
        return tenant

    def _produce(self, prompt: Prompt, options: SamplingOptions, ctx: RequestContext) -> Any:
        async def produce() -> Answer:
            return answer_of([await self.predictor.generate(prompt, options, ctx.request_id)])

        return produce

    # -- chat -------------------------------------------------------------------------------------

    async def chat_completions(
        self, req: oa.ChatCompletionRequest, ctx: RequestContext
    ) -> oa.ChatCompletion | AsyncIterator[oa.ChatCompletionChunk]:
        tenant = self._check(req.model)
        timer = Timer()
        options = req.sampling(self.settings.default_max_tokens)
        mode = self.front.mode(options, ctx.headers)
        if req.messages[-1].role != "user":
            mode = CacheMode(False, False)  # e.g. a tool result: nothing to match
        chat = req.prompt()
        # Only the last user message is matched semantically; everything before it, and whatever
        # else shapes the answer, is part of the key.
        key = self.front.key(tenant, "chat", chat.last_text, options, chat.context())
        rid, created = oa.new_id("chatcmpl"), oa.now()
        if req.stream:
            return await self._stream(key, mode, chat, options, ctx, _ChatChunks(self.name, rid, created),
                                      req.include_usage, timer)
        outcome = await self.front.answer(key, mode, self._produce(chat, options, ctx))
        self._observe(outcome, timer)
        _cache_headers(ctx, outcome.status, outcome.similarity)
        a = outcome.answer
        return oa.chat_completion(rid, self.name, created, a["text"], a["finish_reason"],
                                  int(a.get("prompt_tokens", 0)), int(a["completion_tokens"]))

    # -- completions --------------------------------------------------------------------------------

    async def completions(
        self, req: oa.CompletionRequest, ctx: RequestContext
    ) -> oa.Completion | AsyncIterator[oa.Completion]:
        tenant = self._check(req.model)
        timer = Timer()
        options = req.sampling(self.settings.default_max_tokens)
        mode = self.front.mode(options, ctx.headers)
        prompts = req.prompts
        rid, created = oa.new_id("cmpl"), oa.now()
        if req.stream:
            if len(prompts) != 1:
                raise BadRequest("streaming takes one prompt per request here", "prompt")
            key = self.front.key(tenant, "completion", prompts[0], options)
            return await self._stream(key, mode, prompts[0], options, ctx,
                                      _CompletionChunks(self.name, rid, created), req.include_usage, timer)
        if len(prompts) > self.settings.max_batch_size:
            raise BadRequest(f"at most {self.settings.max_batch_size} prompts per request", "prompt")

        async def one(prompt: str) -> Outcome:
            key = self.front.key(tenant, "completion", prompt, options)
            return await self.front.answer(key, mode, self._produce(prompt, options, ctx))

        outcomes = await asyncio.gather(*(one(p) for p in prompts))
        for o in outcomes:
            self._observe(o, timer)
        statuses = [o.status for o in outcomes]
        _cache_headers(ctx, ",".join(statuses), outcomes[0].similarity if len(outcomes) == 1 else None)
        return oa.completion(
            rid, self.name, created,
            [o.answer["text"] for o in outcomes],
            [o.answer["finish_reason"] for o in outcomes],
            sum(int(o.answer.get("prompt_tokens", 0)) for o in outcomes),
            sum(int(o.answer["completion_tokens"]) for o in outcomes),
        )

    # -- streaming ----------------------------------------------------------------------------------

    async def _stream(
        self, key: CacheRequest, mode: CacheMode, prompt: Prompt, options: SamplingOptions,
        ctx: RequestContext, chunks: _Chunks, include_usage: bool, timer: Timer,
    ) -> AsyncIterator[Any]:
        res = await self.front.lookup(key, mode)
        if res is not None and res.hit and res.answer is not None:
            _cache_headers(ctx, res.status, res.similarity)
            self._observe(Outcome(res.answer, res.status, res.similarity), timer)
            return self._sse(_listed(replay(res.answer)), None, chunks, include_usage, timer, res.status)
        status = "miss" if res is not None else "bypass"
        if res is None:
            metrics.LOOKUPS.labels(self.name, "bypass").inc()
        _cache_headers(ctx, status, res.similarity if res is not None else None)
        pieces = self.front.stream_miss(
            key, mode, res, lambda: self.predictor.stream(prompt, options, ctx.request_id)
        )
        # The first piece before answering, so a predictor that is down or refuses the request is a
        # 503 or 400, not a broken stream.
        try:
            first = await anext(pieces, None)
        except BaseException:
            await pieces.aclose()  # type: ignore[attr-defined]
            raise
        return self._sse(pieces, first, chunks, include_usage, timer, status)

    async def _sse(
        self, pieces: AsyncIterator[Piece], first: Piece | None, chunks: _Chunks, include_usage: bool,
        timer: Timer, status: str,
    ) -> AsyncIterator[Any]:
        seen: list[Piece] = []
        try:
            opening = chunks.start()
            if opening is not None:
                yield opening
            # To the end of `pieces`, which comes once the answer is stored (so that a request that
            # follows finds it), not just to the piece with the finish reason.
            piece = first if first is not None else await anext(pieces, None)
            while piece is not None:
                seen.append(piece)
                for chunk in chunks.piece(piece):
                    yield chunk
                piece = await anext(pieces, None)
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]
        answer = answer_of(seen)
        if include_usage:
            yield chunks.usage(int(answer["prompt_tokens"]), int(answer["completion_tokens"]))
        self._observe(Outcome(answer, status, None), timer)

    def _observe(self, outcome: Outcome, timer: Timer) -> None:
        tracing.annotate(semserve__cache__status=outcome.status)
        metrics.REQUEST_SECONDS.labels(self.name, "openai", outcome.status).observe(timer.seconds())


async def _listed(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        yield piece


class _Chunks:
    """How pieces of a generation become the chunks of one OpenAI stream."""

    def __init__(self, model: str, rid: str, created: int) -> None:
        self.model, self.rid, self.created = model, rid, created

    def start(self) -> Any:
        return None

    def piece(self, piece: Piece) -> list[Any]:
        raise NotImplementedError

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        raise NotImplementedError


class _ChatChunks(_Chunks):
    def start(self) -> Any:
        # OpenAI sends the role first, in a chunk of its own with empty content.
        return oa.chat_chunk(self.rid, self.model, self.created, "", role=True)

    def piece(self, piece: Piece) -> list[Any]:
        out = []
        if piece.text:
            out.append(oa.chat_chunk(self.rid, self.model, self.created, piece.text))
        if piece.finish_reason:
            out.append(oa.chat_chunk(self.rid, self.model, self.created, None,
                                     finish_reason=piece.finish_reason))
        return out

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.chat_usage_chunk(self.rid, self.model, self.created, prompt_tokens, completion_tokens)


class _CompletionChunks(_Chunks):
    def piece(self, piece: Piece) -> list[Any]:
        return [oa.completion_chunk(self.rid, self.model, self.created, 0, piece.text, piece.finish_reason)]

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.completion_usage_chunk(self.rid, self.model, self.created, prompt_tokens,
                                         completion_tokens)
