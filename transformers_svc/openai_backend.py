"""OpenAI completions and chat through the cache. Misses go to the predictor's OpenAI route;
streaming misses are streamed through as they arrive and stored only after a clean end; streaming
hits are replayed as SSE chunks.
"""

from __future__ import annotations

import asyncio
import re
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
from transformers_svc.front import CacheFront, CacheMode, Outcome, Timer, with_revision
from transformers_svc.upstream import PredictorClient, StreamInfo

COMPLETIONS = "/openai/v1/completions"
CHAT = "/openai/v1/chat/completions"
# Replayed hits arrive as word-sized pieces, like a generation would.
_PIECES = re.compile(r"\S+\s*|\s+")


def _cache_headers(ctx: RequestContext, status: str, similarity: float | None) -> None:
    ctx.response_headers["x-semserve-cache"] = status
    if similarity is not None:
        ctx.response_headers["x-semserve-cache-similarity"] = f"{similarity:.4f}"


def _answer_from(choice_text: str, finish: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    return {
        "text": choice_text,
        "finish_reason": finish or "stop",
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
    }


class TransformerOpenAI:
    def __init__(self, settings: TransformerSettings, front: CacheFront, predictor: PredictorClient) -> None:
        self.settings = settings
        self.front = front
        self.predictor = predictor
        self.name = settings.model_name

    def models(self) -> list[oa.OpenAIModelCard]:
        return [oa.model_card(self.name, 0)]

    def _check(self, model: str) -> str:
        tenant = tenant_var.get() or self.settings.tenant
        tracing.annotate(semserve__protocol="openai", semserve__tenant=tenant, gen_ai__request__model=model)
        if model != self.name:
            raise NotFound(f"model {model!r} not found; this server serves {self.name!r}", "model")
        return tenant

    # -- chat -------------------------------------------------------------------------------------

    def _chat_key(self, tenant: str, req: oa.ChatCompletionRequest, options: SamplingOptions) -> CacheRequest:
        messages = req.plain_messages()
        last = messages[-1]
        # Only the last user message is matched semantically; everything before it, and whatever
        # else shapes the answer, is part of the key.
        context = {
            "history": messages[:-1],
            "last_role": last["role"],
            "tools": req.tools,
            "response_format": req.response_format,
        }
        return self.front.key(tenant, "chat", last["content"], options, context)

    async def chat_completions(
        self, req: oa.ChatCompletionRequest, ctx: RequestContext
    ) -> oa.ChatCompletion | AsyncIterator[oa.ChatCompletionChunk]:
        tenant = self._check(req.model)
        timer = Timer()
        options = req.sampling(self.settings.default_max_tokens)
        mode = self.front.mode(options, ctx.headers)
        if req.messages[-1].role != "user":
            mode = CacheMode(False, False)  # e.g. a tool result: nothing to match
        key = self._chat_key(tenant, req, options)
        body = req.model_dump(exclude_none=True)
        rid, created = oa.new_id("chatcmpl"), oa.now()
        if req.stream:
            return await self._stream(key, mode, body, CHAT, ctx, req.include_usage, rid, created,
                                      chat=True, timer=timer)

        async def produce() -> dict[str, Any]:
            data, revision = await self.predictor.openai_json(
                CHAT, {**body, "stream": False}, ctx.request_id
            )
            choice = data["choices"][0]
            answer = _answer_from(choice["message"].get("content") or "", choice.get("finish_reason"),
                                  data.get("usage"))
            return with_revision(answer, revision)

        outcome = await self.front.answer(key, mode, produce)
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
        body = req.model_dump(exclude_none=True)
        if req.stream:
            if len(prompts) != 1:
                raise BadRequest("streaming takes one prompt per request here", "prompt")
            key = self.front.key(tenant, "completion", prompts[0], options)
            return await self._stream(key, mode, {**body, "prompt": prompts[0]}, COMPLETIONS, ctx,
                                      req.include_usage, rid, created, chat=False, timer=timer)
        if len(prompts) > self.settings.max_batch_size:
            raise BadRequest(f"at most {self.settings.max_batch_size} prompts per request", "prompt")

        async def one(prompt: str) -> Outcome:
            key = self.front.key(tenant, "completion", prompt, options)

            async def produce() -> dict[str, Any]:
                data, revision = await self.predictor.openai_json(
                    COMPLETIONS, {**body, "prompt": prompt, "stream": False}, ctx.request_id
                )
                choice = data["choices"][0]
                answer = _answer_from(choice.get("text") or "", choice.get("finish_reason"),
                                      data.get("usage"))
                return with_revision(answer, revision)

            return await self.front.answer(key, mode, produce)

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
        self, key: CacheRequest, mode: CacheMode, body: dict[str, Any], path: str,
        ctx: RequestContext, include_usage: bool, rid: str, created: int, *, chat: bool, timer: Timer,
    ) -> AsyncIterator[Any]:
        res = await self.front.lookup(key, mode)
        if res is not None and res.hit and res.answer is not None:
            _cache_headers(ctx, res.status, res.similarity)
            self._observe(Outcome(res.answer, res.status, res.similarity), timer)
            return self._replay(res.answer, rid, created, include_usage, chat)
        status = "miss" if res is not None else "bypass"
        if res is None:
            metrics.LOOKUPS.labels(self.name, "bypass").inc()
        _cache_headers(ctx, status, res.similarity if res is not None else None)
        upstream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        # Open the upstream before answering, so a predictor that is down is a 503, not a broken stream.
        info = StreamInfo()
        upstream = self.predictor.openai_stream(path, upstream_body, ctx.request_id, info)
        first = await anext(upstream, None)
        return self._pass_through(first, upstream, key, mode, res, rid, created, include_usage, chat,
                                  timer, status, info)

    async def _pass_through(
        self, first: dict[str, Any] | None, upstream: AsyncIterator[dict[str, Any]], key: CacheRequest,
        mode: CacheMode, res: Any, rid: str, created: int, include_usage: bool, chat: bool, timer: Timer,
        status: str, info: StreamInfo,
    ) -> AsyncIterator[Any]:
        pieces: list[str] = []
        finish: str | None = None
        usage: dict[str, Any] | None = None
        clean = False
        try:
            chunk = first
            while chunk is not None:
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if piece:
                        pieces.append(piece)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                forwarded = self._rewrap(chunk, rid, created, chat, include_usage)
                if forwarded is not None:
                    yield forwarded
                chunk = await anext(upstream, None)
            clean = True
        finally:
            if not clean:
                await upstream.aclose()  # type: ignore[attr-defined]
        answer = with_revision(_answer_from("".join(pieces), finish, usage), info.model_revision)
        # Only a stream that ended with [DONE] and a finish reason is a whole answer worth keeping
        # (front.store checks the rest: completeness and the model revision).
        if finish is not None:
            await self.front.store(key, mode, answer, res.vector if res is not None else None)
        self._observe(Outcome(answer, status, None), timer)

    def _rewrap(
        self, chunk: dict[str, Any], rid: str, created: int, chat: bool, include_usage: bool
    ) -> Any:
        if not chunk.get("choices"):
            if include_usage and chunk.get("usage"):
                u = chunk["usage"]
                return (oa.chat_usage_chunk if chat else oa.completion_usage_chunk)(
                    rid, self.name, created, int(u["prompt_tokens"]), int(u["completion_tokens"])
                )
            return None
        choice = chunk["choices"][0]
        if chat:
            delta = choice.get("delta") or {}
            return oa.chat_chunk(rid, self.name, created, delta.get("content"),
                                 finish_reason=choice.get("finish_reason"),
                                 role=delta.get("role") == "assistant")
        return oa.completion_chunk(rid, self.name, created, 0, choice.get("text") or "",
                                   choice.get("finish_reason"))

    async def _replay(
        self, answer: dict[str, Any], rid: str, created: int, include_usage: bool, chat: bool
    ) -> AsyncIterator[Any]:
        text, finish = answer["text"], answer["finish_reason"]
        pieces = _PIECES.findall(text) or [""]
        if chat:
            yield oa.chat_chunk(rid, self.name, created, "", role=True)
            for piece in pieces:
                yield oa.chat_chunk(rid, self.name, created, piece)
            yield oa.chat_chunk(rid, self.name, created, None, finish_reason=finish)
        else:
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                yield oa.completion_chunk(rid, self.name, created, 0, piece, finish if last else None)
        if include_usage:
            make = oa.chat_usage_chunk if chat else oa.completion_usage_chunk
            yield make(rid, self.name, created, int(answer.get("prompt_tokens", 0)),
                       int(answer["completion_tokens"]))

    def _observe(self, outcome: Outcome, timer: Timer) -> None:
        tracing.annotate(semserve__cache__status=outcome.status)
        metrics.REQUEST_SECONDS.labels(self.name, "openai", outcome.status).observe(timer.seconds())
