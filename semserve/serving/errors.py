"""The errors our models raise to KServe, and the HTTP answers for errors KServe and FastAPI would
otherwise answer wrongly (422, 500, 501 where the client's request is at fault: 400)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kserve.errors import InferenceError, InvalidInput, ServerNotReady


class Unavailable503(ServerNotReady):
    """KServe's ServerNotReady (503 / gRPC UNAVAILABLE) with the `reason` its gRPC interceptor
    reads; the original lacks it and turns into UNKNOWN over gRPC."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail)
        self.reason = self.error_msg


class InvalidInput400(InvalidInput):
    """KServe's InvalidInput (400 / gRPC INVALID_ARGUMENT) that also names the request field."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.field = field


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    # KServe raises InferenceError (a 500) while decoding tensors a client sent wrongly,
    # e.g. non-UTF-8 bytes in a JSON-encoded BYTES tensor; our models never raise it.
    app.add_exception_handler(InferenceError, _client_tensor_error)
    app.add_exception_handler(NotImplementedError, _not_supported)


async def _validation_error(_: Any, exc: RequestValidationError) -> JSONResponse:
    # FastAPI answers 422 by default; a malformed v2 body is a plain 400 naming the field.
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = first.get("msg", "invalid request")
    return JSONResponse(status_code=400, content={"error": f"{loc}: {message}" if loc else message})


async def _client_tensor_error(_: Any, exc: InferenceError) -> JSONResponse:
    return JSONResponse(status_code=400, content={"error": str(exc)})


async def _not_supported(_: Any, exc: NotImplementedError) -> JSONResponse:
    # KServe raises NotImplementedError for a feature a request asks for and this server lacks: a
    # `model_version` (our models have none) or v1 `:explain` (no explainer). Its 501 reads as a
    # server fault; the request is what no replica can serve, a 400 that says what is unsupported.
    detail = str(exc) or "this operation"
    return JSONResponse(status_code=400, content={"error": f"not supported by this server: {detail}"})
