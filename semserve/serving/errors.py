"""HTTP answers for errors, from the error table (semserve/errors.py): our models' ServingErrors,
and the answers KServe and FastAPI would otherwise give wrongly (422, 500, 501 where the client's
request is at fault: 400)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kserve.errors import InferenceError

from semserve.errors import ServingError, codes_of, error_headers, error_text, json_error_text
from semserve.logs import get_logger

log = get_logger("semserve.serving")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServingError, _table_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    # KServe raises InferenceError (its handler: 500) while decoding tensors a client sent wrongly,
    # e.g. non-UTF-8 bytes in a JSON-encoded BYTES tensor; our models never raise it.
    app.add_exception_handler(InferenceError, _table_error)
    app.add_exception_handler(NotImplementedError, _not_supported)


async def _table_error(_: Any, exc: Exception) -> JSONResponse:
    status = codes_of(exc).http_status
    # One line, as semserve.logs' filter writes KServe's own expected errors.
    if status == 503:
        log.info("request_not_ready", status=status, error=type(exc).__name__, detail=error_text(exc))
    elif status >= 500:
        log.error("request_failed", status=status, error=type(exc).__name__, detail=error_text(exc))
    else:
        log.warning("request_rejected", status=status, error=type(exc).__name__, detail=error_text(exc))
    return JSONResponse(status_code=status, content={"error": error_text(exc)}, headers=error_headers(exc))


async def _validation_error(_: Any, exc: RequestValidationError) -> JSONResponse:
    # FastAPI answers 422 by default; a malformed v2 body is a plain 400 naming the field, or for
    # a body that is not JSON at all, where and what the syntax error is.
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid" and isinstance(exc.body, str | bytes):
        loc = [p for p in first.get("loc", ()) if p != "body"]
        problem = (first.get("ctx") or {}).get("error") or first.get("msg", "invalid JSON")
        position = loc[0] if loc and isinstance(loc[0], int) else 0
        return JSONResponse(status_code=400, content={"error": json_error_text(problem, exc.body, position)})
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = first.get("msg", "invalid request")
    return JSONResponse(status_code=400, content={"error": f"{loc}: {message}" if loc else message})


async def _not_supported(_: Any, exc: NotImplementedError) -> JSONResponse:
    # KServe raises NotImplementedError for a feature a request asks for and this server lacks: a
    # `model_version` (our models have none) or v1 `:explain` (no explainer). Its 501 reads as a
    # server fault; the request is what no replica can serve, a 400 that says what is unsupported.
    detail = str(exc) or "this operation"
    return JSONResponse(status_code=400, content={"error": f"not supported by this server: {detail}"})
