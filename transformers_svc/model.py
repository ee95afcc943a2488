"""The transformer as KServe sees it, an adapter of the answer pipeline: a kserve.Model whose infer
(v2 REST, gRPC ModelInfer, generate) and infer_stream (ModelStreamInfer, generate_stream) parse the
v2 request, ask transformers_svc/answer_pipeline.py once per prompt of the batch, and render what
comes back (with each prompt's cache_status). Nothing here decides about the cache.

Each request's context (transformers_svc/request_context.py) is made here, once; how it ended goes
to the pipeline's `report` (metrics, the request log).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from kserve import InferRequest, InferResponse
from kserve.errors import ModelNotFound

from semserve import v2
from semserve.answer import Answer, Piece, step_of
from semserve.errors import BadRequest, NotFound, Overloaded, Unavailable
from semserve.errors import BadRequest as InvalidInput400
from semserve.errors import Unavailable as Unavailable503
from semserve.streams import merge_streams
from semserve.v2.text_model import TextModel
from transformers_svc.answer_pipeline import SERVED, AnswerPipeline, AnswerRequest, Outcome
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import (
    RequestContext,
    RequestRecord,
    error_text,
    status_of,
    v2_context,
)

CACHE_STATUS = "cache_status"


@dataclass(frozen=True)
class _Call:
    """One parsed v2 request as the transformer handles it."""

    ctx: RequestContext
    request: v2.TextRequest

    def ask(self, i: int) -> AnswerRequest:
        """The pipeline's request for prompt `i` of the batch."""
        if self.request.chats:
            return AnswerRequest(self.ctx, "chat", self.request.chats[i])
        return AnswerRequest(self.ctx, "completion", self.request.prompts[i])


@contextlib.contextmanager
def _as_kserve_errors(model: str) -> Iterator[None]:
    """The request path's errors as the KServe exceptions its REST and gRPC servers answer."""
    try:
        yield
    except BadRequest as exc:
        raise InvalidInput400(exc.message, exc.field) from None
    except NotFound as exc:
        raise ModelNotFound(model) from exc
    except Overloaded:
        raise  # as it is: its retry_after_s is the answer's Retry-After
    except Unavailable as exc:
        raise Unavailable503(exc.message) from None


class SemanticCacheTransformer(TextModel):
    def __init__(self, settings: TransformerSettings, pipeline: AnswerPipeline) -> None:
        super().__init__(settings.model_name)
        self.settings = settings
        self.pipeline = pipeline
        self.ready = True
        # KServe runs start_engine() beside the HTTP and gRPC servers for a model with `engine` set.
        self.engine = True

    async def start_engine(self) -> None:
        """Start the cache, best effort: with Redis down the transformer still serves (fail open),
        and the cache recreates its index once Redis answers."""
        if self.pipeline.admission is not None:
            self.pipeline.admission.start()
        if self.pipeline.cache is not None:
            await self.pipeline.cache.start()

    async def get_output_types(self) -> list[dict[str, Any]]:
        return [*v2.OUTPUTS_METADATA, {"name": CACHE_STATUS, "datatype": "BYTES", "shape": [-1]}]

    # -- the edge -----------------------------------------------------------------------------------

    def _context(self, payload: InferRequest, headers: dict[str, str] | None, route: str) -> RequestContext:
        return v2_context(payload, headers, model=self.name, default_tenant=self.settings.tenant,
                          route=f"/v2/models/{self.name}/{route}")

    def _call(self, ctx: RequestContext, payload: InferRequest) -> _Call:
        request = v2.parse_request(payload, self.settings.max_batch_size)
        return _Call(ctx.with_sampling(request.sampling), request)

    async def _check_rate(self, ctx: RequestContext) -> None:
        """The tenant's requests per minute, once per client call (a batch is one), before any
        work; RateLimited (429 / RESOURCE_EXHAUSTED) when over it."""
        if self.pipeline.admission is not None:
            refusal = (await self.pipeline.admission.check_request(ctx.tenant)).refusal
            if refusal is not None:
                raise refusal

    # -- whole answers ------------------------------------------------------------------------------

    async def infer(self, payload: InferRequest, headers: dict[str, str]) -> InferResponse:
        started = time.monotonic_ns()
        ctx = self._context(payload, headers, "infer")
        try:
            with _as_kserve_errors(self.name):
                call = self._call(ctx, payload)
                await self._check_rate(ctx)
                outcomes = await asyncio.gather(
                    *(self.pipeline.answer(call.ask(i)) for i in range(call.request.size))
                )
        except BaseException as exc:
            self.pipeline.report(RequestRecord.failed(ctx, exc, v2.text_inputs(payload)))
            raise
        statuses = [o.status for o in outcomes]
        self._record_cache(statuses, started)
        self.pipeline.report(RequestRecord(
            call.ctx, 200, v2.text_inputs(payload), statuses, [o.answer.text for o in outcomes],
            parameters={} if payload.from_grpc else dict(payload.parameters or {}),
        ))
        return v2.build_response(
            self.name,
            ctx.request_id,
            [_result(o.answer) for o in outcomes],
            parameters=self._parameters(ctx, outcomes),
            extra_outputs={CACHE_STATUS: statuses},
        )

    def _parameters(self, ctx: RequestContext, outcomes: list[Outcome]) -> dict[str, Any]:
        params: dict[str, Any] = {v2.PROMPT_TOKENS: sum(o.answer.prompt_tokens for o in outcomes)}
        for name, sims in similarity_parameters([(o.status, o.similarity) for o in outcomes]).items():
            value: Any = sims[0] if len(sims) == 1 else json.dumps(sims)
            params[name] = _wire_number(ctx, value)
        return params

    # -- streams ------------------------------------------------------------------------------------

    async def answer_stream(
        self, payload: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]:
        """ModelStreamInfer and generate_stream. With the `stream` input, each prompt of the batch
        is looked up, then its pieces flow as they come (hits replayed, misses streamed through
        and shared by identical concurrent misses); each response says its prompt's cache_status."""
        started = time.monotonic_ns()
        ctx = self._context(payload, headers, "stream")
        try:
            with _as_kserve_errors(self.name):
                call = self._call(ctx, payload)
                if call.request.stream:  # else predict's infer checks it
                    await self._check_rate(ctx)
        except BaseException as exc:
            self.pipeline.report(RequestRecord.failed(ctx, exc, v2.text_inputs(payload)))
            raise
        if not call.request.stream:
            # A whole answer (the caller keeps the outputs the request names).
            yield v2.StreamPart(await self.infer(payload, headers), final=True)
            return
        size = call.request.size
        statuses = [""] * size
        texts: list[list[str]] = [[] for _ in range(size)]
        status, error = 200, None
        try:
            async for part in self._stream(call, statuses, texts):
                yield part
        except BaseException as exc:
            status, error = status_of(exc), error_text(exc)
            raise
        finally:
            self._record_cache(statuses, started)
            self.pipeline.report(RequestRecord(call.ctx, status, v2.text_inputs(payload), statuses,
                                               ["".join(t) for t in texts], error))

    def _record_cache(self, statuses: list[str], started_ns: int) -> None:
        """Triton's cache statistics: prompts the cache answered, and those it looked up in vain (a
        bypass was not looked up)."""
        hits = sum(s in ("exact", "semantic") for s in statuses)
        misses = sum(s in ("miss", "shared") for s in statuses)
        self.statistics.cached(hits, misses, time.monotonic_ns() - started_ns)

    async def _stream(
        self, call: _Call, statuses: list[str], texts: list[list[str]]
    ) -> AsyncIterator[v2.StreamPart]:
        size = call.request.size
        unfinished = size
        streams = [self._pieces(call, i, statuses) for i in range(size)]
        async for index, (piece, similarity) in merge_streams(streams):
            texts[index].append(piece.text)
            if piece.finish_reason:
                unfinished -= 1
            params: dict[str, Any] = {v2.PROMPT_TOKENS: piece.prompt_tokens}
            for name, [value] in similarity_parameters([(statuses[index], similarity)]).items():
                params[name] = _wire_number(call.ctx, value)
            response = v2.piece_response(
                self.name, call.ctx.request_id, size, index,
                step_of(piece),
                params,
                {CACHE_STATUS: [s if i == index else "" for i, s in enumerate(statuses)]},
            )
            yield v2.StreamPart(response, final=unfinished == 0)

    async def _pieces(
        self, call: _Call, i: int, statuses: list[str]
    ) -> AsyncIterator[tuple[Piece, float | None]]:
        stream = await self.pipeline.stream(call.ask(i))
        statuses[i] = stream.status
        try:
            async for piece in stream:
                yield piece, stream.similarity
        finally:
            await stream.aclose()


def _wire_number(ctx: RequestContext, value: Any) -> Any:
    # Over gRPC the number travels as a string, as it always has (KServe's proto had no double), so
    # that clients of either server read it the same way.
    return str(value) if ctx.protocol == "v2-grpc" else value


def similarity_parameters(outcomes: list[tuple[str, float | None]]) -> dict[str, list[float | None]]:
    """`cache_similarity`: the similarity of the entry served (per prompt; None where none was);
    `cache_rejected_similarity`: that of the nearest entry the verifier rejected, for misses. Each
    is present only when some prompt has one."""
    served = [sim if status in SERVED else None for status, sim in outcomes]
    rejected = [sim if status in ("miss", "shared") else None for status, sim in outcomes]
    out: dict[str, list[float | None]] = {}
    if any(v is not None for v in served):
        out["cache_similarity"] = served
    if any(v is not None for v in rejected):
        out["cache_rejected_similarity"] = rejected
    return out


def _result(answer: Answer) -> Answer:
    return Answer(answer.text, answer.finish_reason, answer.completion_tokens, answer.prompt_tokens,
                  logprobs=answer.logprobs, prompt_logprobs=answer.prompt_logprobs,
                  prompt_text=answer.prompt_text)  # fmt: skip
