"""The kserve.Models both services build on: V2Model answers only the v2 protocol (predict checks
it and keeps the outputs the request names; subclasses answer `infer`), TextModel adds the v2 text
contract (semserve/v2/text_contract.py) in its metadata."""

from __future__ import annotations

from typing import Any

import kserve
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput

from semserve import v2
from semserve.v2.requested_outputs import keep_outputs, requested_outputs


class V2Model(kserve.Model):
    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput(f"this model speaks the v2 protocol: POST /v2/models/{self.name}/infer")
        names = requested_outputs(payload, await self.output_names())
        return keep_outputs(await self.infer(payload, headers or {}), names)

    async def output_names(self) -> list[str]:
        return [output["name"] for output in await self.get_output_types()]

    async def infer(self, payload: InferRequest, headers: dict[str, str]) -> InferResponse:
        raise NotImplementedError


class TextModel(V2Model):
    async def get_input_types(self) -> list[dict[str, Any]]:
        return v2.INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return v2.OUTPUTS_METADATA


def request_id(payload: InferRequest, headers: dict[str, str] | None) -> str:
    """The request's id: the v2 body's `id`, else the x-request-id header, else ""."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    return payload.id or lowered.get("x-request-id") or ""
