"""Triton's model configuration and statistics extensions and its repository index over HTTP, on
both services:

- `GET /v2/models/{name}[/versions/{version}]/config`: the model's configuration
  (semserve/v2/model_config.py);
- `GET /v2/models[/{name}[/versions/{version}]]/stats`: `{"model_stats": [...]}`
  (semserve/v2/statistics.py);
- `POST /v2/repository/index` (body optional, `{"ready": true}` for ready models only): the models
  served, each with its state.

The gRPC service answers the same as `ModelConfig`, `ModelStatistics` and `RepositoryIndex`
(grpc_service.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from semserve.errors import BadRequest, NotFound, ServingError, codes_of, error_text
from semserve.v2.model_config import ModelConfig
from semserve.v2.statistics import VERSION, InferenceStatistics


@runtime_checkable
class TritonModel(Protocol):
    name: str
    ready: bool
    statistics: InferenceStatistics

    async def config(self) -> ModelConfig: ...


def find(models: list[TritonModel], name: str, version: str | None) -> TritonModel:
    """The model named, or a 404; a version is a 400, as the infer routes answer one."""
    found = next((m for m in models if m.name == name), None)
    if found is None:
        names = ", ".join(repr(m.name) for m in models)
        raise NotFound(f"model {name!r} not found; this server serves {names}", "model")
    if version not in (None, VERSION):
        raise BadRequest(f"model versioning is not supported (version {version!r} asked)", "version")
    return found


def index(models: list[TritonModel], ready_only: bool) -> list[dict[str, str]]:
    """The repository index: each model with Triton's state, READY or UNAVAILABLE."""
    return [{"name": m.name, "version": VERSION, "state": "READY" if m.ready else "UNAVAILABLE",
             "reason": "" if m.ready else "not ready"}
            for m in models if m.ready or not ready_only]  # fmt: skip


def register_triton_routes(app: FastAPI, models: list[TritonModel]) -> None:
    def failed(exc: ServingError) -> JSONResponse:
        return JSONResponse(status_code=codes_of(exc).http_status, content={"error": error_text(exc)})

    async def config(model_name: str, version: str | None = None) -> Any:
        try:
            model = find(models, model_name, version)
        except ServingError as exc:
            return failed(exc)
        return (await model.config()).json()

    async def stats(model_name: str | None = None, version: str | None = None) -> Any:
        try:
            chosen = models if model_name is None else [find(models, model_name, version)]
        except ServingError as exc:
            return failed(exc)
        return {"model_stats": [m.statistics.json(m.name) for m in chosen]}

    async def repository_index(request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return failed(BadRequest("the body is not valid JSON"))
        ready = body.get("ready", False) if isinstance(body, dict) else None
        if not isinstance(ready, bool):
            return failed(BadRequest("ready must be true or false", "ready"))
        return index(models, ready)

    routes: list[tuple[str, Callable[..., Any]]] = [
        ("/v2/models/{model_name}/config", config),
        ("/v2/models/{model_name}/versions/{version}/config", config),
        ("/v2/models/stats", stats),
        ("/v2/models/{model_name}/stats", stats),
        ("/v2/models/{model_name}/versions/{version}/stats", stats),
    ]
    for path, endpoint in routes:
        app.add_api_route(path, endpoint, methods=["GET"], tags=["v2"])
    app.add_api_route("/v2/repository/index", repository_index, methods=["POST"], tags=["v2"])
