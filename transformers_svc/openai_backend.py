"""OpenAI completions and chat, an adapter of the answer pipeline (transformers_svc/answer_pipeline.py):
parse, build one AnswerRequest per prompt, call `answer` or `stream`, and format (cache headers,
SSE chunks). Nothing here decides about the cache.

Chat and completions differ only in their wire format: a formatter each (`ChatFormatter`,
`CompletionFormatter`) turns answers and pieces into OpenAI's objects. Each request's context is
made here, once; how it ended goes to the pipeline's `report` (metrics, the request log).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from cache.keys import Kind
from semserve import openai_protocol as oa
from semserve import openai_routes, tracing
from semserve.answer import Answer, Piece, answer_of
from semserve.errors import BadRequest, NotFound
from transformers_svc.answer_pipeline import (
    SERVED,
    AnswerPipeline,
    AnswerRequest,
    AnswerStream,
    Outcome,
    Prompt,
)
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import (
    RequestContext,
    RequestRecord,
    error_text,
    openai_context,
    status_of,
)

# The routes as the request log names them.
CHAT_ROUTE = "/openai/v1/chat/completions"
COMPLETIONS_ROUTE = "/openai/v1/completions"


def _cache_headers(http: openai_routes.OpenAIHttpCall, status: str, similarity: float | None) -> None:
    http.response_headers["x-semserve-cache"] = status
    if similarity is None:
        return
    # A miss names the similarity of the entry it rejected as such, not as the answer's.
    served = all(s in SERVED for s in status.split(","))
    name = "x-semserve-cache-similarity" if served else "x-semserve-cache-rejected-similarity"
    http.response_headers[name] = f"{similarity:.4f}"


class Formatter:
    """How answers and the pieces of a generation become one OpenAI response or stream."""

    def __init__(self, model: str, rid: str, created: int, usage: oa.UsageReport) -> None:
        self.model, self.rid, self.created = model, rid, created
        self.usage_report = usage

    def whole(self, answers: list[Answer]) -> Any:
        raise NotImplementedError

    def start(self, first: Piece | None) -> Any:
        """The chunk before the first piece (`first`, when it is known by then), if any."""
        return None

    def piece(self, piece: Piece) -> list[Any]:
        raise NotImplementedError

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        raise NotImplementedError


class ChatFormatter(Formatter):
    def whole(self, answers: list[Answer]) -> oa.ChatCompletion:
        # One answer per choice (OpenAI's n) of one prompt: its tokens counted once.
        return oa.chat_completion(self.rid, self.model, self.created, [a.text for a in answers],
                                  [a.finish_reason for a in answers], answers[0].prompt_tokens,
                                  sum(a.completion_tokens for a in answers))  # fmt: skip

    def start(self, first: Piece | None) -> Any:
        # OpenAI sends the role first, in a chunk of its own with empty content.
        so_far = self.usage_report.so_far(first.prompt_tokens, 0) if first is not None else None
        return self._chunk("", None, so_far, role=True)

    def piece(self, piece: Piece) -> list[Any]:
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        out = []
        if piece.text:
            out.append(self._chunk(piece.text, None, so_far))
        if piece.finish_reason:
            out.append(self._chunk(None, piece.finish_reason, so_far))
        return out

    def _chunk(
        self, content: str | None, finish_reason: str | None, so_far: Any, *, role: bool = False
    ) -> Any:
        return oa.chat_chunk(self.rid, self.model, self.created, content, finish_reason, role, so_far,
                             self.usage_report.final)  # fmt: skip

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.chat_usage_chunk(self.rid, self.model, self.created, prompt_tokens, completion_tokens)


class CompletionFormatter(Formatter):
    def __init__(self, model: str, rid: str, created: int, usage: oa.UsageReport, n: int = 1) -> None:
        super().__init__(model, rid, created, usage)
        self.n = n

    def whole(self, answers: list[Answer]) -> oa.Completion:
        # Prompt by prompt, its n choices together: each prompt's tokens counted once.
        return oa.completion(
            self.rid, self.model, self.created,
            [a.text for a in answers],
            [a.finish_reason for a in answers],
            sum(a.prompt_tokens for a in answers[:: self.n]),
            sum(a.completion_tokens for a in answers),
        )

    def piece(self, piece: Piece) -> list[Any]:
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        return [oa.completion_chunk(self.rid, self.model, self.created, 0, piece.text, piece.finish_reason,
                                    so_far)]  # fmt: skip

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.completion_usage_chunk(self.rid, self.model, self.created, prompt_tokens,
                                         completion_tokens)


@dataclass(frozen=True)
class _Request:
    """One OpenAI request as the backend handles it: its context, the route's own (for the cache
    headers), the body (for the full request log) and the prompts the log hashes."""

    ctx: RequestContext
    http: openai_routes.OpenAIHttpCall
    body: BaseModel
    prompts: list[str]


class TransformerOpenAI:
    def __init__(self, settings: TransformerSettings, pipeline: AnswerPipeline) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.name = settings.model_name
        # OpenAI's `created` of the model card: when this server started serving it.
        self.created = int(time.time())
        # With misses held while the predictor starts, a stream waiting that long for its first
        # token gets SSE comments (semserve/openai_routes.py KeepsStreamsAlive).
        self.sse_keepalive_s = settings.sse_keepalive_s if settings.predictor_hold_s > 0 else None

    def models(self) -> list[oa.OpenAIModelCard]:
        return [oa.model_card(self.name, self.created)]

    # -- the edge -----------------------------------------------------------------------------------

    def _request(
        self, http: openai_routes.OpenAIHttpCall, body: BaseModel, model: str, route: str, prompts: list[str]
    ) -> _Request:
        ctx = openai_context(http, model=model, default_tenant=self.settings.tenant, route=route)
        return _Request(ctx, http, body, prompts)

    async def _check(self, r: _Request, model: str) -> None:
        if model != self.name:
            raise NotFound(f"model {model!r} not found; this server serves {self.name!r}", "model")
        # The tenant's requests per minute, once per call, hits included, before any work; its
        # limits' state goes on the response, a 429's included (OpenAI's x-ratelimit-* headers).
        if self.pipeline.admission is not None:
            rate = await self.pipeline.admission.check_request(r.ctx.tenant)
            r.http.response_headers.update(rate.headers())
            if rate.refusal is not None:
                raise rate.refusal

    async def chat_completions(
        self, req: oa.ChatCompletionRequest, http: openai_routes.OpenAIHttpCall
    ) -> oa.ChatCompletion | AsyncIterator[oa.ChatCompletionChunk]:
        last = req.messages[-1].text if req.messages else ""
        r = self._request(http, req, req.model, CHAT_ROUTE, [last])
        try:
            return await self._chat(r, req)
        except BaseException as exc:
            self._failed(r, exc)
            raise

    async def completions(
        self, req: oa.CompletionRequest, http: openai_routes.OpenAIHttpCall
    ) -> oa.Completion | AsyncIterator[oa.Completion]:
        r = self._request(http, req, req.model, COMPLETIONS_ROUTE, req.prompts)
        try:
            return await self._completions(r, req)
        except BaseException as exc:
            self._failed(r, exc)
            raise

    # -- chat and completions -----------------------------------------------------------------------

    async def _chat(self, r: _Request, req: oa.ChatCompletionRequest) -> Any:
        await self._check(r, req.model)
        r = replace(r, ctx=r.ctx.with_sampling(req.sampling(self.settings.default_max_tokens)))
        req.check_choices(1, self.settings.max_batch_size)
        fmt = ChatFormatter(self.name, oa.new_id("chatcmpl"), oa.now(), req.usage_report)
        if req.stream:  # n is 1 (oa's unsupported())
            return await self._stream(r, AnswerRequest(r.ctx, "chat", req.prompt()), fmt)
        return self._whole(r, await self._choices("chat", req.prompt(), r.ctx.choices(req.n)), fmt)

    async def _completions(self, r: _Request, req: oa.CompletionRequest) -> Any:
        await self._check(r, req.model)
        r = replace(r, ctx=r.ctx.with_sampling(req.sampling(self.settings.default_max_tokens)))
        prompts = req.prompts
        fmt = CompletionFormatter(self.name, oa.new_id("cmpl"), oa.now(), req.usage_report, req.n)
        if req.stream:
            if len(prompts) != 1:
                raise BadRequest("streaming takes one prompt per request here", "prompt")
            return await self._stream(r, AnswerRequest(r.ctx, "completion", prompts[0]), fmt)
        req.check_choices(len(prompts), self.settings.max_batch_size)
        # Prompt by prompt, its n choices together (vLLM's order: choice index = prompt * n + j).
        contexts = r.ctx.choices(req.n)
        per_prompt = await asyncio.gather(*(self._choices("completion", p, contexts) for p in prompts))
        return self._whole(r, [o for outcomes in per_prompt for o in outcomes], fmt)

    # -- whole answers ------------------------------------------------------------------------------

    async def _choices(self, kind: Kind, prompt: Prompt, contexts: list[RequestContext]) -> list[Outcome]:
        """The outcomes of one prompt's choices. Identical choices (greedy ones) are one request,
        answered once: the copies say "shared" when it was generated, so the first choice's status
        is always the request's own (concurrent copies would race for the single flight's lead)."""
        if all(c == contexts[0] for c in contexts[1:]):
            first = await self._answer(AnswerRequest(contexts[0], kind, prompt))
            copy = replace(first, status="shared") if first.status == "miss" else first
            return [first] + [copy] * (len(contexts) - 1)
        return list(await asyncio.gather(*(self._answer(AnswerRequest(c, kind, prompt)) for c in contexts)))

    async def _answer(self, ask: AnswerRequest) -> Outcome:
        with _chat_field(ask):
            return await self.pipeline.answer(ask)

    def _whole(self, r: _Request, outcomes: list[Outcome], fmt: Formatter) -> Any:
        statuses = [o.status for o in outcomes]
        _cache_headers(r.http, ",".join(statuses), outcomes[0].similarity if len(outcomes) == 1 else None)
        self._record(r, 200, statuses, [o.answer.text for o in outcomes])
        return fmt.whole([o.answer for o in outcomes])

    # -- streaming ----------------------------------------------------------------------------------

    async def _stream(self, r: _Request, ask: AnswerRequest, fmt: Formatter) -> AsyncIterator[Any]:
        with _chat_field(ask):
            pieces = await self.pipeline.stream(ask)
        _cache_headers(r.http, pieces.status, pieces.similarity)
        tracing.annotate(semserve__cache__status=pieces.status)
        # The first piece before answering, so a predictor that is down or refuses the request is a
        # 503 or 400, not a broken stream.
        try:
            with _chat_field(ask):
                first = await anext(pieces, None)
        except BaseException:
            await pieces.aclose()
            raise
        return self._sse(r, pieces, first, fmt)

    async def _sse(
        self, r: _Request, pieces: AnswerStream, first: Piece | None, fmt: Formatter
    ) -> AsyncIterator[Any]:
        seen: list[Piece] = []
        code, error = 200, None
        try:
            try:
                piece = first
                if piece is None and fmt.usage_report.continuous:
                    # Its usage so far names the prompt's tokens, which the first piece brings.
                    piece = await anext(pieces, None)
                opening = fmt.start(piece)
                if opening is not None:
                    yield opening
                # The last piece comes once the answer is stored (so that a request that follows
                # finds it, through any replica).
                piece = piece if piece is not None else await anext(pieces, None)
                while piece is not None:
                    seen.append(piece)
                    for chunk in fmt.piece(piece):
                        yield chunk
                    piece = await anext(pieces, None)
            finally:
                await pieces.aclose()
            answer = answer_of(seen)
            if fmt.usage_report.final:
                yield fmt.usage(answer.prompt_tokens, answer.completion_tokens)
        except BaseException as exc:  # the client left (cancelled), or a failure mid-stream
            code, error = status_of(exc), error_text(exc)
            raise
        finally:
            self._record(r, code, [pieces.status], ["".join(p.text for p in seen)], error)

    # -- what is observed ---------------------------------------------------------------------------

    def _record(
        self, r: _Request, status: int, cache: list[str], answers: list[str], error: str | None = None
    ) -> None:
        self.pipeline.report(RequestRecord(r.ctx, status, r.prompts, cache, answers, error, body=r.body))

    def _failed(self, r: _Request, exc: BaseException) -> None:
        cache = r.http.response_headers.get("x-semserve-cache", "")
        self._record(r, status_of(exc), cache.split(",") if cache else [], [], error_text(exc))


@contextlib.contextmanager
def _chat_field(ask: AnswerRequest) -> Iterator[None]:
    """A chat the predictor refuses names the v2 input it came in (`chat[0]`); this route's client
    sent `messages`."""
    try:
        yield
    except BadRequest as exc:
        if ask.kind == "chat" and exc.field is not None and exc.field.startswith("chat"):
            raise BadRequest(exc.message.replace(exc.field, "messages"), "messages") from None
        raise
