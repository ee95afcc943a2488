"""The predictor as KServe sees it: a kserve.Model whose predict runs prompts through vLLM.

The v2 adapter (REST infer, gRPC ModelInfer and ModelStreamInfer, generate and generate_stream):
it parses the text tensor contract, calls the engine's one generation path (predictors/engine.py)
and formats the answers or pieces as v2 responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kserve import InferRequest, InferResponse

from predictors.config import PredictorSettings
from predictors.engine import Engine, Prepared
from semserve import tracing, v2
from semserve.answer import step_of
from semserve.errors import BadRequest, Unavailable
from semserve.errors import BadRequest as InvalidInput400
from semserve.errors import Unavailable as Unavailable503
from semserve.streams import merge_streams
from semserve.v2.text_model import TextModel, request_id


class VLLMPredictor(TextModel):
    BACKEND = "vllm"

    def __init__(self, settings: PredictorSettings, engine: Engine) -> None:
        super().__init__(settings.model_name)
        self.settings = settings
        self.llm = engine

    def load(self) -> bool:
        # `engine = True` makes the ModelServer run start_engine() beside the HTTP and gRPC servers;
        # readiness (healthy) stays false until vLLM is up.
        self.ready = True
        self.engine = True
        return self.ready

    async def start_engine(self) -> None:
        await self.llm.start()

    async def watch(self) -> None:
        """Raises once the engine has died (the server then ends the process)."""
        await self.llm.watch()

    def stop(self) -> None:
        self.llm.shutdown()

    async def healthy(self) -> bool:
        return self.ready and await self.llm.healthy()

    async def infer(self, payload: InferRequest, headers: dict[str, str]) -> InferResponse:
        try:
            request, prepared = await self._prepare(payload)
            return await self._whole(payload, headers, request, prepared)
        except BadRequest as exc:
            raise InvalidInput400(exc.message, exc.field) from None
        except Unavailable as exc:
            raise Unavailable503(exc.message) from None

    async def _whole(
        self, payload: InferRequest, headers: dict[str, str] | None, request: v2.TextRequest,
        prepared: list[Prepared],
    ) -> InferResponse:
        rid = request_id(payload, headers)
        answers = await self.llm.answers(prepared, rid, _protocol(payload), _operation(request))
        return v2.build_response(
            self.name, rid, answers, parameters=self._parameters(sum(a.prompt_tokens for a in answers))
        )

    async def answer_stream(
        self, payload: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]:
        """ModelStreamInfer and generate_stream: with the `stream` input, one response per new text
        piece of any prompt of the batch (the others empty), else one response with everything."""
        request, prepared = await self._prepare(payload)
        rid = request_id(payload, headers)
        if not request.stream:
            yield v2.StreamPart(await self._whole(payload, headers, request, prepared), final=True)
            return
        size = len(prepared)
        params = self._parameters(sum(len(p.token_ids) for p in prepared))
        unfinished = size
        streams = [
            self.llm.generate(p, f"{rid}-{i}" if size > 1 else rid, _protocol(payload),
                              _operation(request))
            for i, p in enumerate(prepared)
        ]
        async for index, piece in merge_streams(streams):
            if piece.finish_reason:
                unfinished -= 1
            # A v2 piece response carries the new text and the counts so far in the answer columns.
            response = v2.piece_response(self.name, rid, size, index, step_of(piece), params)
            yield v2.StreamPart(response, final=unfinished == 0)

    async def _prepare(self, payload: InferRequest) -> tuple[v2.TextRequest, list[Prepared]]:
        if not self.llm.ready:
            raise Unavailable503(f"model {self.name} is not ready: the engine is still starting")
        tracing.annotate(semserve__protocol=_protocol(payload), gen_ai__request__model=self.name)
        request = v2.parse_request(payload, self.settings.max_batch_size)
        if request.chats:
            prompts = [self.llm.render_chat(chat) for chat in request.chats]
            fields = [f"{v2.CHAT_INPUT}[{i}]" for i in range(len(prompts))]
        else:
            prompts = request.prompts
            name = v2.TEXT_INPUT if all(isinstance(p, str) for p in prompts) else v2.IDS_INPUT
            fields = [f"{name}[{i}]" for i in range(len(prompts))]
        prepared = [
            await self.llm.prepare(p, request.sampling, field=f) for p, f in zip(prompts, fields, strict=True)
        ]
        return request, prepared

    def _parameters(self, prompt_tokens: int) -> dict[str, Any]:
        params: dict[str, Any] = {v2.PROMPT_TOKENS: prompt_tokens}
        if self.settings.model_revision:
            params[v2.MODEL_REVISION] = self.settings.model_revision
        return params


def _operation(request: v2.TextRequest) -> str:
    # GenAI semantic conventions' operation name, on the generation span.
    return "chat" if request.chats else "text_completion"


def _protocol(payload: InferRequest) -> str:
    return "v2-grpc" if payload.from_grpc else "v2-rest"
