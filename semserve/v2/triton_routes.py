"""Triton's model configuration and statistics extensions over HTTP, on both services:

- `GET /v2/models/{name}[/versions/{version}]/config`: the model's configuration
  (semserve/v2/model_config.py);
- `GET /v2/models[/{name}[/versions/{version}]]/stats`: `{"model_stats": [...]}`
  (semserve/v2/statistics.py).

The gRPC service answers the same as `ModelConfig` and `ModelStatistics` (grpc_service.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from semserve.errors import BadRequest, NotFound, ServingError, codes_of, error_text
from semserve.v2.model_config import ModelConfig
from semserve.v2.statistics import VERSION, InferenceStatistics


@runtime_checkable
class TritonModel(Protocol):
    name: str
    statistics: InferenceStatistics

    async def config(self) -> ModelConfig: ...


def served(model: TritonModel, name: str, version: str | None) -> None:
    """A 404 unless `name` is what this server serves; a 400 for a version, as the infer routes
    answer one."""
    if name != model.name:
        raise NotFound(f"model {name!r} not found; this server serves {model.name!r}", "model")
    if version not in (None, VERSION):
        raise BadRequest(f"model versioning is not supported (version {version!r} asked)", "version")


def register_triton_routes(app: FastAPI, model: TritonModel) -> None:
    def failed(exc: ServingError) -> JSONResponse:
        return JSONResponse(status_code=codes_of(exc).http_status, content={"error": error_text(exc)})

    async def config(model_name: str, version: str | None = None) -> Any:
        try:
            served(model, model_name, version)
        except ServingError as exc:
            return failed(exc)
        return (await model.config()).json()

    async def stats(model_name: str | None = None, version: str | None = None) -> Any:
        try:
            if model_name is not None:
                served(model, model_name, version)
        except ServingError as exc:
            return failed(exc)
        return {"model_stats": [model.statistics.json(model.name)]}

    routes: list[tuple[str, Callable[..., Any]]] = [
        ("/v2/models/{model_name}/config", config),
        ("/v2/models/{model_name}/versions/{version}/config", config),
        ("/v2/models/stats", stats),
        ("/v2/models/{model_name}/stats", stats),
        ("/v2/models/{model_name}/versions/{version}/stats", stats),
    ]
    for path, endpoint in routes:
        app.add_api_route(path, endpoint, methods=["GET"], tags=["v2"])
