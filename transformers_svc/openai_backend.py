"""OpenAI completions and chat, an adapter of the answer pipeline (transformers_svc/answer_pipeline.py):
parse, build one AnswerRequest per prompt, call `answer` or `stream`, and format (cache headers,
SSE chunks). Nothing here decides about the cache.

Chat and completions differ only in their wire format: a formatter each (semserve/openai_format.py)
turns answers and pieces into OpenAI's objects. Each request's context is
made here, once; how it ended goes to the pipeline's `report` (metrics, the request log).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from cache.keys import Kind
from semserve import openai_protocol as oa
from semserve import openai_routes, tracing
from semserve.answer import Piece, answer_of
from semserve.errors import BadRequest, NotFound
from semserve.openai_format import ChatFormatter, CompletionFormatter, Formatter
from semserve.streams import merge_streams
from transformers_svc.answer_pipeline import (
    SERVED,
    AnswerPipeline,
    AnswerRequest,
    AnswerStream,
    CacheStatus,
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

# The routes as the request log names them when the call does not say its path.
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


@dataclass(frozen=True)
class _Request:
    """One OpenAI request as the backend handles it: its context, the route's own (for the cache
    headers), the body (for the full request log) and the prompts the log hashes."""

    ctx: RequestContext
    http: openai_routes.OpenAIHttpCall
    body: BaseModel
    prompts: list[str]


@dataclass(frozen=True)
class _Choices:
    """One answer to make and the choices it answers (OpenAI's `n`): several when they are
    identical (greedy ones). Copies made concurrently would race for the single flight's lead,
    so the first choice's status would not always be the request's own."""

    indexes: list[int]
    ask: AnswerRequest

    def statuses(self, status: CacheStatus) -> list[CacheStatus]:
        """The cache status of each choice, given the answer's: copies of a generation were
        shared from it; copies of a hit are that hit."""
        return [status] + ["shared" if status == "miss" else status] * (len(self.indexes) - 1)


def _plan(kind: Kind, prompts: list[Prompt], contexts: list[RequestContext]) -> list[_Choices]:
    """The answers to make for every prompt's choices, in vLLM's order (choice index = prompt * n
    + j): one per choice, or one per prompt when its choices are identical."""
    n = len(contexts)
    if all(c == contexts[0] for c in contexts[1:]):
        return [_Choices(list(range(p * n, p * n + n)), AnswerRequest(contexts[0], kind, prompt))
                for p, prompt in enumerate(prompts)]  # fmt: skip
    return [_Choices([p * n + j], AnswerRequest(c, kind, prompt))
            for p, prompt in enumerate(prompts) for j, c in enumerate(contexts)]  # fmt: skip


@dataclass(frozen=True)
class _Streamed:
    """The stream of one answer to make, and the choices it answers."""

    choices: _Choices
    pieces: AnswerStream
    first: Piece | None  # taken before answering (None: the stream had none)

    @property
    def indexes(self) -> list[int]:
        return self.choices.indexes

    def statuses(self) -> list[CacheStatus]:
        return self.choices.statuses(self.pieces.status)

    async def all_pieces(self) -> AsyncIterator[Piece]:
        if self.first is not None:
            yield self.first
        async for piece in self.pieces:
            yield piece


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
        ctx = openai_context(http, model=model, default_tenant=self.settings.tenant, route=http.path or route)
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
        r = self._request(http, req, req.model, COMPLETIONS_ROUTE, [_recorded(p) for p in req.prompts])
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
        tools = req.prompt().tool_use()
        fmt = ChatFormatter(self.name, oa.new_id("chatcmpl"), oa.now(), req.usage_report, req.n, tools)
        plan = _plan("chat", [req.prompt()], r.ctx.choices(req.n))
        return await (self._stream(r, plan, fmt) if req.stream else self._whole(r, plan, fmt))

    async def _completions(self, r: _Request, req: oa.CompletionRequest) -> Any:
        await self._check(r, req.model)
        r = replace(r, ctx=r.ctx.with_sampling(req.sampling(self.settings.default_max_tokens)))
        prompts = req.prompts
        fmt = CompletionFormatter(self.name, oa.new_id("cmpl"), oa.now(), req.usage_report, req.echoes())
        req.check_choices(len(prompts), self.settings.max_batch_size)
        plan = _plan("completion", list(prompts), r.ctx.choices(req.n))
        return await (self._stream(r, plan, fmt) if req.stream else self._whole(r, plan, fmt))

    # -- whole answers ------------------------------------------------------------------------------

    async def _answer(self, ask: AnswerRequest) -> Outcome:
        with _chat_field(ask):
            return await self.pipeline.answer(ask)

    async def _whole(self, r: _Request, plan: list[_Choices], fmt: Formatter) -> Any:
        answered = await asyncio.gather(*(self._answer(one.ask) for one in plan))
        outcomes = [replace(outcome, status=status) for one, outcome in zip(plan, answered, strict=True)
                    for status in one.statuses(outcome.status)]  # fmt: skip
        statuses = [o.status for o in outcomes]
        _cache_headers(r.http, ",".join(statuses), outcomes[0].similarity if len(outcomes) == 1 else None)
        self._record(r, 200, statuses, [o.answer.text for o in outcomes])
        return fmt.whole([o.answer for o in outcomes])

    # -- streaming ----------------------------------------------------------------------------------

    async def _stream(self, r: _Request, plan: list[_Choices], fmt: Formatter) -> AsyncIterator[Any]:
        """Every choice, streamed together (each chunk names its choice's index)."""
        opened = await self._open_all([one.ask for one in plan])
        streamed = [_Streamed(one, *pair) for one, pair in zip(plan, opened, strict=True)]
        statuses = [status for one in streamed for status in one.statuses()]
        similarity = streamed[0].pieces.similarity if len(statuses) == 1 else None
        _cache_headers(r.http, ",".join(statuses), similarity)
        tracing.annotate(semserve__cache__status=",".join(statuses))
        return self._sse(r, streamed, statuses, fmt)

    async def _open_all(self, asks: list[AnswerRequest]) -> list[tuple[AnswerStream, Piece | None]]:
        """The streams of `asks`, each with its first piece, opened together; if one fails, those
        opened are closed and its failure raised."""
        if len(asks) == 1:
            return [await self._open(asks[0])]
        tasks = [asyncio.ensure_future(self._open(a)) for a in asks]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    await task.result()[0].aclose()
            raise

    async def _open(self, ask: AnswerRequest) -> tuple[AnswerStream, Piece | None]:
        with _chat_field(ask):
            pieces = await self.pipeline.stream(ask)
        # The first piece before answering, so a predictor that is down or refuses the request is a
        # 503 or 400, not a broken stream.
        try:
            with _chat_field(ask):
                return pieces, await anext(pieces, None)
        except BaseException:
            await pieces.aclose()
            raise

    async def _sse(
        self, r: _Request, streamed: list[_Streamed], statuses: list[str], fmt: Formatter
    ) -> AsyncIterator[Any]:
        seen: dict[int, list[Piece]] = {i: [] for one in streamed for i in one.indexes}
        code, error = 200, None
        try:
            try:
                for one in streamed:
                    for i in one.indexes:
                        opening = fmt.start(one.first, i)
                        if opening is not None:
                            yield opening
                # The last piece comes once the answer is stored (so that a request that follows
                # finds it, through any replica).
                async for k, piece in merge_streams([one.all_pieces() for one in streamed]):
                    for i in streamed[k].indexes:
                        seen[i].append(piece)
                        for chunk in fmt.piece(piece, i):
                            yield chunk
            finally:
                for one in streamed:
                    await one.pieces.aclose()
            if fmt.usage_report.final:
                yield fmt.total_usage([answer_of(seen[i]) for i in sorted(seen)])
        except BaseException as exc:  # the client left (cancelled), or a failure mid-stream
            code, error = status_of(exc), error_text(exc)
            raise
        finally:
            self._record(r, code, statuses, ["".join(p.text for p in seen[i]) for i in sorted(seen)], error)

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


def _recorded(prompt: oa.CompletionPrompt) -> str:
    """A prompt as the request log records it: its text, or its token ids as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(list(prompt.ids))
