"""Where KServe's own behaviour is wrong for a pod that serves one model from start to exit: its
readiness (always true), its model repository extension (lets a client unload the model), and its
server metadata (it lists only that extension)."""

from __future__ import annotations

from typing import Any

import orjson
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.errors import InferenceError, InvalidInput, ModelNotFound
from kserve.model_repository import ModelRepository
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from pydantic import ValidationError

from semserve.errors import BadRequest
from semserve.serving.state import ServingState

# Triton's extensions these services serve beside KServe's repository extension: binary tensors
# and parameters (KServe's), the generate routes, model configuration and statistics (ours).
SERVED_EXTENSIONS = ("binary_tensor_data", "parameters", "generate", "model_configuration", "statistics")


class ReadinessDataPlane(DataPlane):
    """KServe's server readiness is always true; ours is false while draining or loading."""

    def __init__(self, state: ServingState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state = state

    async def ready(self) -> bool:
        if self._state.draining:
            return False
        for model in self.model_registry.get_models().values():
            if not await model.healthy():
                return False
        return await super().ready()

    def metadata(self) -> dict[str, Any]:
        # KServe lists only its repository extension; these are Triton's names of the others served.
        served = super().metadata()
        served["extensions"] = [*served["extensions"], *SERVED_EXTENSIONS]
        return served

    def decode_inference_request(self, body: Any, headers: Any, model_name: str) -> Any:
        # KServe's decoding of a client's body (the binary tensor extension above all) raises
        # TypeError/KeyError/ValueError on malformed input, e.g. a JSON header that is `null` or a
        # non-numeric inference-header-content-length; those are the client's error, a 400.
        if isinstance(body, bytes) and not (headers or {}).get(INFERENCE_CONTENT_LENGTH_HEADER):
            # Without the binary extension's header the body is JSON whatever its content type, as
            # Triton reads it (tritonclient sends JSON with no content type, its aio client as
            # octet-stream); FastAPI handed it over as bytes because of that content type.
            body = _json_request(body)
        try:
            return super().decode_inference_request(body, headers, model_name)
        except (InferenceError, InvalidInput):
            raise
        except Exception as exc:
            raise InvalidInput(f"malformed inference request: {type(exc).__name__}: {exc}") from None


def _json_request(body: bytes) -> InferenceRequest:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest(
            f"the body is not JSON, and for binary tensor data the {INFERENCE_CONTENT_LENGTH_HEADER!r} "
            "header is missing (send JSON, or the binary extension with its header)",
            INFERENCE_CONTENT_LENGTH_HEADER,
        ) from None
    try:
        return InferenceRequest.model_validate(parsed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"{where}: {first['msg']}" if where else first["msg"], where) from None


class ServedModels(ModelRepositoryExtension):
    """KServe's model repository extension (v2 `/v2/repository/models/{name}/load|unload` and their
    gRPC twins) for a server whose models are fixed at start: one pod serves one model from start to
    exit, and Knative scales pods, not models.

    KServe's own answers `load` of a name it does not serve with 503 "not ready" (its registry's
    load is a no-op), and lets any client `unload` the served model, after which the pod stays ready
    while every request fails with 404."""

    def __init__(self, model_registry: ModelRepository) -> None:
        super().__init__(model_registry)
        self.models = model_registry  # ours: the base class keeps it in a private field

    async def load(self, model_name: str) -> None:
        if self.models.get_model(model_name) is None:
            raise ModelNotFound(model_name)
        await super().load(model_name)  # already loaded: 200, or 503 while the engine still starts

    async def unload(self, model_name: str) -> None:
        if self.models.get_model(model_name) is None:
            raise ModelNotFound(model_name)
        raise InvalidInput(
            f"model control is disabled: this server serves {model_name!r} until it exits "
            "and cannot unload it (scale with replicas instead)"
        )
