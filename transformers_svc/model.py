"""The transformer as KServe sees it: a kserve.Model whose predict answers v2 requests from the cache
or forwards the misses to the predictor, and whose infer_stream does the same for ModelStreamInfer
and the generate routes (hits replayed as pieces, misses streamed through).

KServe runs preprocess -> predict -> postprocess and preprocess cannot end the chain, so the cache
hit is decided in predict (see ../shared/reference/kserve.md).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import kserve
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput, ModelNotFound

from cache.keys import CacheRequest
from semserve import tracing, v2
from semserve.errors import BadRequest, NotFound, Unavailable
from semserve.serving import InvalidInput400, Unavailable503
from semserve.streams import merge_streams
from transformers_svc import metrics
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.front import Answer, CacheFront, CacheMode, Outcome, Timer, answer_of
from transformers_svc.upstream import Piece, PredictorClient, Prompt

CACHE_STATUS = "cache_status"
# Replayed hits arrive as word-sized pieces, like a generation would.
_PIECES = re.compile(r"\S+\s*|\s+")


def replay(answer: Answer) -> list[Piece]:
    """A cached answer as the pieces of a generation; the last carries the finish reason and counts."""
    texts = _PIECES.findall(answer["text"]) or [""]
    last = len(texts) - 1
    revision = answer.get("model_revision")
    return [
        Piece(
            text=t,
            finish_reason=answer["finish_reason"] if i == last else None,
            completion_tokens=int(answer["completion_tokens"]) if i == last else 0,
            prompt_tokens=int(answer.get("prompt_tokens", 0)),
            model_revision=revision,
        )
        for i, t in enumerate(texts)
    ]


@dataclass(frozen=True)
class _Call:
    """One v2 request as the transformer handles it."""

    request: v2.TextRequest
    tenant: str
    request_id: str
    protocol: str
    mode: CacheMode

    def prompt(self, i: int) -> Prompt:
        return self.request.chats[i] if self.request.chats else self.request.prompts[i]


class SemanticCacheTransformer(kserve.Model):
    def __init__(self, settings: TransformerSettings, front: CacheFront, predictor: PredictorClient) -> None:
        super().__init__(settings.model_name)
        self.settings = settings
        self.front = front
        self.predictor = predictor
        self.ready = True
        # KServe runs start_engine() beside the HTTP and gRPC servers for a model with `engine` set.
        self.engine = True

    async def start_engine(self) -> None:
        """Start the cache, best effort: with Redis down the transformer still serves (fail open),
        and the cache recreates its index once Redis answers."""
        if self.front.cache is not None:
            await self.front.cache.start()

    async def get_input_types(self) -> list[dict[str, Any]]:
        return v2.INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return [*v2.OUTPUTS_METADATA, {"name": CACHE_STATUS, "datatype": "BYTES", "shape": [-1]}]

    def _call(self, payload: InferRequest, headers: dict[str, str] | None) -> _Call:
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        protocol = "v2-grpc" if payload.from_grpc else "v2-rest"
        tenant = tenant_var.get() or self.settings.tenant
        tracing.annotate(
            semserve__protocol=protocol, semserve__tenant=tenant, gen_ai__request__model=self.name
        )
        request = v2.parse_request(payload, self.settings.max_batch_size)
        mode = self.front.mode(request.sampling, lowered)
        if request.chats and any(chat.messages[-1].role != "user" for chat in request.chats):
            mode = CacheMode(False, False)  # e.g. a tool result: nothing to match
        request_id = payload.id or lowered.get("x-request-id") or ""
        return _Call(request, tenant, request_id, protocol, mode)

    def _key(self, call: _Call, i: int) -> CacheRequest:
        sampling = call.request.sampling
        if call.request.chats:
            chat = call.request.chats[i]
            # Only the last user message is matched semantically; everything before it, and
            # whatever else shapes the answer, is part of the key.
            return self.front.key(call.tenant, "chat", chat.last_text, sampling, chat.context())
        return self.front.key(call.tenant, "completion", call.request.prompts[i], sampling)

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput("this model speaks the v2 protocol: POST /v2/models/{name}/infer")
        timer = Timer()
        try:
            call = self._call(payload, headers)
            outcomes = await asyncio.gather(*(self._one(call, i) for i in range(call.request.size)))
        except BadRequest as exc:
            raise InvalidInput400(exc.message, exc.field) from None
        except NotFound as exc:
            raise ModelNotFound(self.name) from exc
        except Unavailable as exc:
            raise Unavailable503(exc.message) from None
        statuses = [o.status for o in outcomes]
        tracing.annotate(semserve__cache__status=",".join(statuses))
        for status in set(statuses):
            metrics.REQUEST_SECONDS.labels(self.name, call.protocol, status).observe(timer.seconds())
        return v2.build_response(
            self.name,
            call.request_id,
            [_result(o.answer) for o in outcomes],
            parameters=self._parameters(call, outcomes),
            extra_outputs={CACHE_STATUS: statuses},
        )

    def _parameters(self, call: _Call, outcomes: list[Outcome]) -> dict[str, Any]:
        params: dict[str, Any] = {
            v2.PROMPT_TOKENS: sum(int(o.answer.get("prompt_tokens", 0)) for o in outcomes)
        }
        for name, sims in similarity_parameters([(o.status, o.similarity) for o in outcomes]).items():
            value: Any = sims[0] if len(sims) == 1 else json.dumps(sims)
            # Over gRPC the number travels as a string, as it always has (KServe's proto had no
            # double), so that clients of either server read it the same way.
            params[name] = str(value) if call.protocol == "v2-grpc" else value
        return params

    async def _one(self, call: _Call, i: int) -> Outcome:
        async def produce() -> Answer:
            piece = await self.predictor.generate(call.prompt(i), call.request.sampling, call.request_id)
            return answer_of([piece])

        return await self.front.answer(self._key(call, i), call.mode, produce)

    async def infer_stream(
        self, payload: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]:
        """ModelStreamInfer and generate_stream. With the `stream` input, each prompt of the batch
        is looked up, then its pieces flow as they come (hits replayed, misses streamed through
        and shared by identical concurrent misses); each response says its prompt's cache_status."""
        try:
            call = self._call(payload, headers)
        except BadRequest as exc:
            raise InvalidInput400(exc.message, exc.field) from None
        if not call.request.stream:
            yield v2.StreamPart(await self.predict(payload, headers), final=True)
            return
        timer = Timer()
        size = call.request.size
        statuses = [""] * size
        unfinished = size
        streams = [self._pieces(call, i, statuses) for i in range(size)]
        async for index, (piece, similarity) in merge_streams(streams):
            if piece.finish_reason:
                unfinished -= 1
                metrics.REQUEST_SECONDS.labels(self.name, call.protocol, statuses[index]).observe(
                    timer.seconds()
                )
            params: dict[str, Any] = {v2.PROMPT_TOKENS: piece.prompt_tokens}
            for name, [value] in similarity_parameters([(statuses[index], similarity)]).items():
                params[name] = str(value) if call.protocol == "v2-grpc" else value
            response = v2.piece_response(
                self.name, call.request_id, size, index,
                v2.TextResult(piece.text, piece.finish_reason or "", piece.completion_tokens),
                params,
                {CACHE_STATUS: [s if i == index else "" for i, s in enumerate(statuses)]},
            )
            yield v2.StreamPart(response, final=unfinished == 0)

    async def _pieces(
        self, call: _Call, i: int, statuses: list[str]
    ) -> AsyncIterator[tuple[Piece, float | None]]:
        key = self._key(call, i)
        res = await self.front.lookup(key, call.mode)
        if res is not None and res.hit and res.answer is not None:
            statuses[i] = res.status
            for piece in replay(res.answer):
                yield piece, res.similarity
            return
        statuses[i] = "miss" if res is not None else "bypass"
        if res is None:
            metrics.LOOKUPS.labels(self.name, "bypass").inc()
        similarity = res.similarity if res is not None else None
        pieces = self.front.stream_miss(
            key, call.mode, res,
            lambda: self.predictor.stream(call.prompt(i), call.request.sampling, call.request_id),
        )
        try:
            async for piece in pieces:
                yield piece, similarity
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]


SERVED = ("exact", "semantic")


def similarity_parameters(outcomes: list[tuple[str, float | None]]) -> dict[str, list[float | None]]:
    """`cache_similarity`: the similarity of the entry served (per prompt; None where none was);
    `cache_rejected_similarity`: that of the nearest entry the verifier rejected, for misses. Each
    is present only when some prompt has one."""
    served = [sim if status in SERVED else None for status, sim in outcomes]
    rejected = [sim if status == "miss" else None for status, sim in outcomes]
    out: dict[str, list[float | None]] = {}
    if any(v is not None for v in served):
        out["cache_similarity"] = served
    if any(v is not None for v in rejected):
        out["cache_rejected_similarity"] = rejected
    return out


def _result(answer: Answer) -> v2.TextResult:
    return v2.TextResult(
        answer["text"], answer["finish_reason"], int(answer["completion_tokens"]),
        int(answer.get("prompt_tokens", 0)),
    )

