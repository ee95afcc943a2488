"""The predictor as KServe sees it: a kserve.Model whose predict runs prompts through vLLM."""

from __future__ import annotations

from typing import Any

import kserve
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput

from predictors.config import PredictorSettings
from predictors.engine import Engine
from semserve import tracing, v2
from semserve.errors import BadRequest, Unavailable
from semserve.serving import Unavailable503


class VLLMPredictor(kserve.Model):
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

    async def get_input_types(self) -> list[dict[str, Any]]:
        return v2.INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return v2.OUTPUTS_METADATA

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput("this model speaks the v2 protocol: POST /v2/models/{name}/infer")
        if not self.llm.ready:
            raise Unavailable503(f"model {self.name} is not ready: the engine is still starting")
        protocol = "v2-grpc" if payload.from_grpc else "v2-rest"
        request_id = payload.id or (headers or {}).get("x-request-id") or ""
        tracing.annotate(semserve__protocol=protocol, gen_ai__request__model=self.name)
        try:
            request = v2.parse_request(payload, self.settings.max_batch_size)
            prepared = [
                await self.llm.prepare(p, request.sampling, field=f"text_input[{i}]")
                for i, p in enumerate(request.prompts)
            ]
            results = await self.llm.generate_many(prepared, request_id, protocol)
        except BadRequest as exc:
            raise InvalidInput(exc.message) from None
        except Unavailable as exc:
            raise Unavailable503(exc.message) from None
        params: dict[str, Any] = {"prompt_tokens": sum(r.prompt_tokens for r in results)}
        if self.settings.model_revision:
            params[v2.MODEL_REVISION] = self.settings.model_revision
        return v2.build_response(
            self.name,
            request_id,
            [
                v2.TextResult(r.text, r.finish_reason, r.completion_tokens, r.prompt_tokens)
                for r in results
            ],
            parameters=params,
        )
