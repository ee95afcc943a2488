"""The kserve.Models both services build on: V2Model answers only the v2 protocol (predict checks
it and keeps the outputs the request names; subclasses answer `infer`) and keeps Triton's
statistics of what it answered; TextModel adds the v2 text contract (semserve/v2/text_contract.py)
in its metadata and streams (subclasses answer `answer_stream`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import kserve
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput

from semserve import v2
from semserve.v2.model_config import ModelConfig
from semserve.v2.requested_outputs import keep_outputs, requested_outputs
from semserve.v2.statistics import InferenceStatistics


class V2Model(kserve.Model):
    # Triton's name for what answers: "vllm" (the predictor), "python" (the transformer).
    BACKEND = "python"

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        self.statistics = InferenceStatistics()

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"this model speaks the v2 protocol: POST /v2/models/{self.name}/infer")
        names = requested_outputs(payload, await self.output_names())
        started, ok = time.monotonic_ns(), False
        try:
            response = keep_outputs(await self.infer(payload, headers or {}), names)
            ok = True
            return response
        finally:
            self.statistics.record(ok, time.monotonic_ns() - started, prompts_of(payload))

    async def output_names(self) -> list[str]:
        return [output["name"] for output in await self.get_output_types()]

    async def infer(self, payload: InferRequest, headers: dict[str, str]) -> InferResponse:
        raise NotImplementedError

    async def config(self) -> ModelConfig:
        inputs, outputs = await self.get_input_types(), await self.get_output_types()
        return ModelConfig(self.name, self.BACKEND, inputs, outputs)


class TextModel(V2Model):
    """A model of the text contract: it answers streams too (ModelStreamInfer, generate_stream)."""

    async def infer_stream(
        self, payload: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]:
        """The model's `answer_stream`, recorded in its statistics."""
        started, ok = time.monotonic_ns(), False
        try:
            async for part in self.answer_stream(payload, headers):
                yield part
            ok = True
        finally:
            self.statistics.record(ok, time.monotonic_ns() - started, prompts_of(payload))

    def answer_stream(self, payload: InferRequest, headers: dict[str, str]) -> AsyncIterator[v2.StreamPart]:
        raise NotImplementedError

    async def get_input_types(self) -> list[dict[str, Any]]:
        return v2.INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return v2.OUTPUTS_METADATA


def prompts_of(payload: InferRequest) -> int:
    """How many prompts a request holds (its prompt input's first dimension), for the statistics."""
    for tensor in payload.inputs:
        if tensor.name in (v2.TEXT_INPUT, v2.CHAT_INPUT, v2.IDS_INPUT) and tensor.shape:
            if tensor.name == v2.IDS_INPUT and len(tensor.shape) == 1:
                return 1  # [L]: one prompt of L tokens
            first = tensor.shape[0]
            return first if isinstance(first, int) and first > 0 else 0
    return 0


def request_id(payload: InferRequest, headers: dict[str, str] | None) -> str:
    """The request's id: the v2 body's `id`, else the x-request-id header, else ""."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    return payload.id or lowered.get("x-request-id") or ""
