"""Triton's generate extension over HTTP, on both services:

- `POST /v2/models/{name}/generate`: one JSON answer;
- `POST /v2/models/{name}/generate_stream`: Server-Sent Events, one event per new text piece.

The body is a JSON object whose keys are the model's inputs (`"text_input": "..."`, or `"chat"`, or
`"stream"`) plus an optional `"id"` and `"parameters"` object (sampling, as on the other routes); a
response flattens the outputs to keys (`"text_output"`, `"finish_reason"`, `"completion_tokens"`,
...; one value for a batch of one, else a list) next to `model_name`, `id` and `parameters`. Both
routes run the model's `infer_stream`, as ModelStreamInfer does, so inputs, sampling and the
transformer's cache behave alike on every protocol.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from kserve import InferInput, InferRequest, InferResponse
from kserve.errors import InvalidInput, ModelNotFound, ServerNotReady

from semserve import v2
from semserve.errors import (
    BadRequest,
    NotFound,
    ServingError,
    codes_of,
    error_headers,
    error_text,
    json_error_text,
)
from semserve.logs import request_id_var
from semserve.v2.grpc_service import StreamingModel


def _input(name: str, value: Any) -> InferInput:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise BadRequest(f"input {name!r} is empty", name)
    if all(isinstance(v, bool) for v in values):
        datatype = "BOOL"
    elif all(isinstance(v, str) for v in values):
        datatype = "BYTES"
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        datatype = "INT64"
    elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        datatype = "FP64"
    elif name == v2.CHAT_INPUT and all(isinstance(v, dict) for v in values):
        # A chat prompt may be given as the object itself rather than its JSON text.
        values, datatype = [json.dumps(v) for v in values], "BYTES"
    else:
        raise BadRequest(f"input {name!r} must be a string, number, boolean or a list of one kind", name)
    return InferInput(name, [len(values)], datatype, values)


def infer_request(model_name: str, body: Any, *, stream: bool | None) -> InferRequest:
    """The generate body as a v2 request; `stream` (when not None) is what the route imposes."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("parameters must be an object", "parameters")
    request_id = body.get("id") or ""
    if not isinstance(request_id, str):
        raise BadRequest("id must be a string", "id")
    fields = {k: v for k, v in body.items() if k not in ("id", "parameters")}
    if stream is not None:
        fields.pop(v2.STREAM_INPUT, None)
        params = {**params, v2.STREAM_INPUT: stream}
    inputs = [_input(name, value) for name, value in fields.items()]
    return InferRequest(model_name, inputs, request_id=request_id, parameters=params)


def flatten(response: InferResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"model_name": response.model_name, "id": response.id or ""}
    for output in response.outputs:
        values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in output.data]
        out[output.name] = values[0] if len(values) == 1 else values
    params = {k: v for k, v in (response.parameters or {}).items() if k != v2.FINAL_RESPONSE}
    if params:
        out["parameters"] = params
    return out


def register_generate_routes(app: FastAPI, model: StreamingModel) -> None:
    def headers_of(request: Request) -> dict[str, str]:
        headers = dict(request.headers)
        rid = request_id_var.get()
        if rid and "x-request-id" not in headers:
            headers["x-request-id"] = rid
        return headers

    async def parsed(request: Request, model_name: str, stream: bool | None) -> InferRequest:
        if model_name != model.name:
            raise NotFound(f"model {model_name!r} not found; this server serves {model.name!r}", "model")
        raw = await request.body()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadRequest(json_error_text(exc.msg, exc.doc, exc.pos)) from None
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        return infer_request(model_name, body, stream=stream)

    def failed(exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=codes_of(exc).http_status, content={"error": error_text(exc)},
                            headers=error_headers(exc))

    async def generate(model_name: str, request: Request) -> Response:
        try:
            infer = await parsed(request, model_name, stream=False)
            last: InferResponse | None = None
            async for part in model.infer_stream(infer, headers_of(request)):
                last = part.response
            if last is None:
                raise ServerNotReady("the model gave no answer")
            return JSONResponse(flatten(last))
        except (ServingError, InvalidInput, ModelNotFound, ServerNotReady) as exc:
            return failed(exc)

    async def generate_stream(model_name: str, request: Request) -> Response:
        try:
            infer = await parsed(request, model_name, stream=None)
            if not any(i.name == v2.STREAM_INPUT for i in infer.inputs):
                # generate_stream streams unless the body says otherwise.
                infer.parameters = {v2.STREAM_INPUT: True, **(infer.parameters or {})}
            parts = model.infer_stream(infer, headers_of(request))
            # The first piece before the status line: a bad request is a 400, not a broken stream.
            first = await anext(parts, None)
        except (ServingError, InvalidInput, ModelNotFound, ServerNotReady) as exc:
            return failed(exc)
        return StreamingResponse(_events(first, parts), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    for path, handler in (("generate", generate), ("generate_stream", generate_stream)):
        endpoint: Callable[..., Any] = handler
        app.add_api_route(f"/v2/models/{{model_name}}/{path}", endpoint, methods=["POST"], tags=["v2"])


async def _events(first: v2.StreamPart | None, parts: AsyncIterator[v2.StreamPart]) -> AsyncIterator[bytes]:
    try:
        part = first
        while part is not None:
            yield f"data: {json.dumps(flatten(part.response))}\n\n".encode()
            if part.final:
                break
            part = await anext(parts, None)
    except (ServingError, InvalidInput, ModelNotFound, ServerNotReady) as exc:
        # Headers are gone once streaming started: the error travels as the last event.
        yield f"data: {json.dumps({'error': error_text(exc)})}\n\n".encode()
    finally:
        await parts.aclose()  # type: ignore[attr-defined]
