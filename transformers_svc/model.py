"""The transformer as KServe sees it: a kserve.Model whose predict answers v2 requests from the cache
or forwards the misses to the predictor.

KServe runs preprocess -> predict -> postprocess and preprocess cannot end the chain, so the cache
hit is decided in predict (see ../shared/reference/kserve.md).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kserve
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput, ModelNotFound

from semserve import tracing, v2
from semserve.errors import BadRequest, NotFound, Unavailable
from semserve.serving import Unavailable503
from transformers_svc import metrics
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.front import CacheFront, Outcome, Timer, with_revision
from transformers_svc.upstream import PredictorClient

CACHE_STATUS = "cache_status"


class SemanticCacheTransformer(kserve.Model):
    def __init__(self, settings: TransformerSettings, front: CacheFront, predictor: PredictorClient) -> None:
        super().__init__(settings.model_name)
        self.settings = settings
        self.front = front
        self.predictor = predictor
        self.ready = True

    async def get_input_types(self) -> list[dict[str, Any]]:
        return v2.INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return [*v2.OUTPUTS_METADATA, {"name": CACHE_STATUS, "datatype": "BYTES", "shape": [-1]}]

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput("this model speaks the v2 protocol: POST /v2/models/{name}/infer")
        timer = Timer()
        headers = {k.lower(): v for k, v in (headers or {}).items()}
        protocol = "v2-grpc" if payload.from_grpc else "v2-rest"
        tenant = tenant_var.get() or self.settings.tenant
        request_id = payload.id or headers.get("x-request-id") or ""
        tracing.annotate(
            semserve__protocol=protocol, semserve__tenant=tenant, gen_ai__request__model=self.name
        )
        try:
            request = v2.parse_request(payload, self.settings.max_batch_size)
            mode = self.front.mode(request.sampling, headers)
            outcomes = await asyncio.gather(
                *(self._one(tenant, p, request.sampling, mode, request_id) for p in request.prompts)
            )
        except BadRequest as exc:
            raise InvalidInput(exc.message) from None
        except NotFound as exc:
            raise ModelNotFound(self.name) from exc
        except Unavailable as exc:
            raise Unavailable503(exc.message) from None
        statuses = [o.status for o in outcomes]
        tracing.annotate(semserve__cache__status=",".join(statuses))
        for status in set(statuses):
            metrics.REQUEST_SECONDS.labels(self.name, protocol, status).observe(timer.seconds())
        sims = [o.similarity for o in outcomes]
        similarity: Any = sims[0] if len(sims) == 1 else json.dumps(sims)
        params: dict[str, Any] = {}
        if similarity is not None:
            value = float(similarity) if len(sims) == 1 else similarity
            # KServe's v2 proto has no double parameter: over gRPC the number travels as a string.
            params["cache_similarity"] = str(value) if payload.from_grpc else value
        return v2.build_response(
            self.name,
            request_id,
            [
                v2.TextResult(o.answer["text"], o.answer["finish_reason"], int(o.answer["completion_tokens"]))
                for o in outcomes
            ],
            parameters=params or None,
            extra_outputs={CACHE_STATUS: statuses},
        )

    async def _one(self, tenant: str, prompt: str, sampling: Any, mode: Any, request_id: str) -> Outcome:
        req = self.front.key(tenant, "completion", prompt, sampling)

        async def produce() -> dict[str, Any]:
            [result], revision = await self.predictor.generate_v2([prompt], sampling, request_id)
            return with_revision({
                "text": result.text,
                "finish_reason": result.finish_reason,
                "completion_tokens": result.completion_tokens,
                "prompt_tokens": result.prompt_tokens,
            }, revision)

        return await self.front.answer(req, mode, produce)
