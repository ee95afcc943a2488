"""OpenAI-compatible HTTP routes added to a KServe app, over a backend each service provides.

The routes own the wire: JSON parsing, validation into request models, error bodies, SSE framing
(`data: {...}` per chunk, then `data: [DONE]`; the Responses API's named events, `Framing`). The
backend owns what an answer is: completions and chats (a response is the chat it means,
semserve/openai_responses.py).

A backend whose streams may wait long for their first chunk (KeepsStreamsAlive: the transformer
holding a miss while its predictor starts) has its stream's response started once that wait passes
`sse_keepalive_s`, with an SSE comment line that often until the first chunk: proxies then see bytes
and keep the connection, and SSE clients skip comments. Past that point a failure is an error event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from semserve.errors import (
    BadRequest,
    NotFound,
    RateLimited,
    ServingError,
    codes_of,
    error_headers,
    json_error_text,
)
from semserve.logs import get_logger, request_id_var
from semserve.openai_protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    OpenAIModelCard,
    error_body,
    validation_error,
)
from semserve.openai_responses import ResponseEvents, ResponseShape, ResponsesRequest, response_of

log = get_logger("semserve.openai")

ROUTE_PREFIX = "/openai"
# Response header: the model revision that produced the answer (predictor --model-revision).
MODEL_REVISION_HEADER = "x-semserve-model-revision"


@dataclass
class OpenAIHttpCall:
    """One HTTP call to an OpenAI route, as the backend sees it: its id, its headers, and the
    headers the backend wants on the response."""

    request_id: str
    headers: dict[str, str]
    # The path asked (a response's chat reaches the backend from /v1/responses).
    path: str = ""
    # Headers the backend wants on the response (e.g. the transformer's x-semserve-cache).
    response_headers: dict[str, str] = field(default_factory=dict)


class OpenAIBackend(Protocol):
    def models(self) -> list[OpenAIModelCard]: ...

    async def completions(
        self, req: CompletionRequest, ctx: OpenAIHttpCall
    ) -> Completion | AsyncIterator[Completion]: ...

    async def chat_completions(
        self, req: ChatCompletionRequest, ctx: OpenAIHttpCall
    ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]: ...


@runtime_checkable
class KeepsStreamsAlive(Protocol):
    """A backend whose streams may wait long for their first chunk: past `sse_keepalive_s` of
    waiting, the stream's response starts with SSE comments that often until it comes (None or 0:
    never)."""

    sse_keepalive_s: float | None


# The comment line a waiting stream gets (SSE: a line that starts with ':' is no event).
KEEPALIVE_COMMENT = b": waiting for the model to start\n\n"


def _error_content(exc: ServingError) -> dict[str, Any]:
    code = "rate_limit_exceeded" if isinstance(exc, RateLimited) else None  # as OpenAI's 429 says
    return error_body(exc.message, codes_of(exc).openai_type, exc.field, code)


def error_response(exc: ServingError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The error's JSON answer, with `headers` (the backend's, e.g. x-ratelimit-*) and Retry-After."""
    return JSONResponse(status_code=codes_of(exc).http_status, content=_error_content(exc),
                        headers={**(headers or {}), **error_headers(exc)})


def _dump(obj: BaseModel) -> str:
    return obj.model_dump_json(exclude_unset=True)


async def _sse(stream: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield f"data: {_dump(chunk)}\n\n".encode()
    except ServingError as exc:
        # Headers are gone once streaming started: the error travels as a final event.
        yield f"data: {json.dumps(_error_content(exc))}\n\n".encode()
    yield b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Framing:
    """How a route writes the backend's answer: a whole one as one JSON object, a stream as the
    bytes of its SSE events (its failure included, as the API ends such a stream)."""

    whole: Callable[[Any], BaseModel]
    stream: Callable[[AsyncIterator[Any]], AsyncIterator[bytes]]


# Completions and chat completions: the backend's objects as they are, `data:` events, `[DONE]`.
AS_IS = Framing(whole=lambda answer: answer, stream=_sse)


def responses_framing(req: ResponsesRequest) -> Framing:
    """The Responses API: the chat answer as a response object, its chunks as named events."""
    shape = ResponseShape(req)

    async def events(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        async for event in ResponseEvents(shape).events(chunks):
            yield f"event: {event.type}\ndata: {_dump(event)}\n\n".encode()

    return Framing(whole=lambda chat: response_of(shape, chat), stream=events)


async def _one(chunk: BaseModel) -> AsyncIterator[BaseModel]:
    yield chunk


async def _raising(exc: ServingError) -> AsyncIterator[BaseModel]:
    raise exc
    yield  # an async generator that fails at its first item


async def _sse_once_answered(
    pending: asyncio.Future[Any], interval_s: float, framing: Framing
) -> AsyncIterator[bytes]:
    """A stream whose backend has not answered yet: a comment every `interval_s` until it does, then
    its chunks (or its error as the final event); leaving early cancels the backend's call."""
    result: Any = None
    try:
        while True:
            yield KEEPALIVE_COMMENT
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if done:
                break
        try:
            result = pending.result()
        except ServingError as exc:
            async for part in framing.stream(_raising(exc)):
                yield part
            return
        stream, result = (_one(result) if isinstance(result, BaseModel) else result), None
        async for part in framing.stream(stream):
            yield part
    finally:
        if not pending.done():
            pending.cancel()
        elif result is not None and hasattr(result, "aclose"):
            await result.aclose()  # answered, but the client left before reading it


async def _parse(request: Request, model_cls: type[BaseModel]) -> Any:
    body = await request.body()
    try:
        data = json.loads(body)
    except RecursionError:  # e.g. 100k nested "[": the stdlib parser recurses per level
        raise BadRequest("request body is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(json_error_text(exc.msg, exc.doc, exc.pos)) from None
    except ValueError as exc:
        # UnicodeDecodeError, and the plain ValueError of an integer literal over
        # Python's 4300-digit limit.
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def body_openapi(model_cls: type[BaseModel], served: list[str]) -> dict[str, Any]:
    """`openapi_extra` documenting the JSON body a route parses by hand with `_parse` (FastAPI sees
    only a `Request` there, so its document would show no body and clients, schemathesis included,
    could not know what to send). Documentation only: parsing and validation stay in `_parse`.

    `model` is listed as the names this server serves, the only ones the backends accept (any other
    is a 404). Nested models are inlined: pydantic's `#/$defs/...` references would resolve against
    the root of the OpenAPI document, where those definitions are not."""
    schema = model_cls.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})
    schema["properties"]["model"] = {**schema["properties"]["model"], "enum": served}

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**defs[ref.removeprefix("#/$defs/")], **rest})
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}
    }


def register_openai_routes(app: FastAPI, backend: OpenAIBackend, prefix: str = ROUTE_PREFIX) -> None:
    keepalive_s = backend.sse_keepalive_s if isinstance(backend, KeepsStreamsAlive) else None
    if keepalive_s is not None and keepalive_s <= 0:
        keepalive_s = None  # 0 (or less): no comments

    def context(request: Request) -> OpenAIHttpCall:
        rid = request_id_var.get() or request.headers.get("x-request-id") or ""
        return OpenAIHttpCall(request_id=rid, headers=dict(request.headers), path=request.url.path)

    def respond(result: Any, ctx: OpenAIHttpCall, framing: Framing) -> Response:
        if isinstance(result, BaseModel):
            whole = framing.whole(result)
            return Response(_dump(whole), media_type="application/json", headers=ctx.response_headers)
        return StreamingResponse(
            framing.stream(result),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", **ctx.response_headers},
        )

    async def answer(
        call: Awaitable[Any], stream: bool, ctx: OpenAIHttpCall, framing: Framing = AS_IS
    ) -> Response:
        """The backend's answer; a stream whose answer takes over `keepalive_s` starts with comments."""
        if not stream or not keepalive_s:
            return respond(await call, ctx, framing)
        pending = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
        except BaseException:  # the client left
            pending.cancel()
            raise
        if done:
            return respond(pending.result(), ctx, framing)
        return StreamingResponse(
            _sse_once_answered(pending, keepalive_s, framing),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", **ctx.response_headers},
        )

    async def list_models() -> Response:
        cards = backend.models()
        body = {"object": "list", "data": [c.model_dump() for c in cards]}
        return JSONResponse(body)

    async def get_model(model_name: str) -> Response:
        for card in backend.models():
            if card.id == model_name:
                return JSONResponse(card.model_dump())
        return error_response(NotFound(f"model {model_name!r} not found", "model"))

    async def completions(request: Request) -> Response:
        ctx = context(request)
        try:
            req = await _parse(request, CompletionRequest)
            req.unsupported()
            return await answer(backend.completions(req, ctx), bool(req.stream), ctx)
        except ServingError as exc:
            return error_response(exc, ctx.response_headers)

    async def chat_completions(request: Request) -> Response:
        ctx = context(request)
        try:
            req = await _parse(request, ChatCompletionRequest)
            req.unsupported()
            return await answer(backend.chat_completions(req, ctx), bool(req.stream), ctx)
        except ServingError as exc:
            return error_response(exc, ctx.response_headers)

    async def responses(request: Request) -> Response:
        # The chat the request means, answered as any chat (semserve/openai_responses.py).
        ctx = context(request)
        try:
            req = await _parse(request, ResponsesRequest)
            req.unsupported()
            chat = req.chat_request()
            return await answer(backend.chat_completions(chat, ctx), req.stream, ctx, responses_framing(req))
        except ServingError as exc:
            return error_response(exc, ctx.response_headers)

    async def stored_response(response_id: str) -> Response:
        # The openai client's retrieve, delete, cancel and input_items: nothing is ever stored.
        message = (f"response {response_id!r} not found: this server stores no responses "
                   "(send the whole conversation in input)")  # fmt: skip
        return error_response(NotFound(message, "response_id"))

    served = [card.id for card in backend.models()]
    # Before our own routes and KServe's: `/v1/models` is KServe's v1 model list, which an OpenAI
    # client pointed at .../v1 would read as an empty list.
    register_wrong_prefix_routes(app, prefix)
    for base in served_prefixes(prefix):
        # The alias (vLLM's `/v1`) stays out of the OpenAPI document: one entry per operation.
        documented = base == prefix
        app.add_api_route(f"{base}/v1/models", list_models, methods=["GET"], tags=["openai"],
                          include_in_schema=documented)
        if documented:
            # Not at /v1/models/{name}: that is KServe's v1 model-ready route.
            app.add_api_route(f"{base}/v1/models/{{model_name}}", get_model, methods=["GET"],
                              tags=["openai"])
        app.add_api_route(
            f"{base}/v1/completions", completions, methods=["POST"], tags=["openai"],
            openapi_extra=body_openapi(CompletionRequest, served), include_in_schema=documented,
        )
        app.add_api_route(
            f"{base}/v1/chat/completions", chat_completions, methods=["POST"], tags=["openai"],
            openapi_extra=body_openapi(ChatCompletionRequest, served), include_in_schema=documented,
        )
        app.add_api_route(
            f"{base}/v1/responses", responses, methods=["POST"], tags=["openai"],
            openapi_extra=body_openapi(ResponsesRequest, served), include_in_schema=documented,
        )
        for tail, methods in (("", ["GET", "DELETE"]), ("/cancel", ["POST"]), ("/input_items", ["GET"])):
            app.add_api_route(f"{base}/v1/responses/{{response_id}}{tail}", stored_response, methods=methods,
                              include_in_schema=False)  # fmt: skip


def served_prefixes(prefix: str) -> list[str]:
    """Where the OpenAI routes are served: under `prefix`, and with the default prefix also at
    vLLM's `/v1` (the base URL most OpenAI-compatible servers answer at). A configured prefix is
    the only one."""
    return [prefix, ""] if prefix == ROUTE_PREFIX else [prefix]


# The OpenAI paths a client reaches with a habitual base URL: vLLM's (`/v1`), KServe's default
# (`/openai/v1`), and a base URL that forgot `/v1`.
_OPENAI_PATHS = (
    ("/models", "GET"), ("/completions", "POST"), ("/chat/completions", "POST"), ("/responses", "POST"),
)
_HABITUAL_PREFIXES = ("", ROUTE_PREFIX)


def wrong_prefix_paths(prefix: str) -> list[str]:
    """Paths that look like an OpenAI route under another base URL than this server's."""
    served = served_prefixes(prefix)
    bases = [f"{p}/v1" for p in _HABITUAL_PREFIXES if p not in served]
    if prefix:
        bases.append(prefix)  # base URL without /v1
    return [f"{base}{path}" for base in bases for path, _ in _OPENAI_PATHS]


def register_wrong_prefix_routes(app: FastAPI, prefix: str) -> None:
    """Answer an OpenAI request sent under the wrong base URL with a 404 that names the right one,
    instead of KServe's v1 protocol (an empty model list) or a bare "Not Found"."""

    async def wrong_prefix(request: Request) -> JSONResponse:
        tail = next(p for p, _ in _OPENAI_PATHS if request.url.path.endswith(p))
        base = f"{str(request.base_url).rstrip('/')}{prefix}/v1"
        message = (
            f"no OpenAI route at {request.url.path}: this server's OpenAI base URL is {base} "
            f"(e.g. {request.method} {prefix}/v1{tail}); set base_url={base!r} in your client"
        )
        log.warning("openai_wrong_prefix", path=request.url.path, expected_base=f"{prefix}/v1")
        kind = codes_of(NotFound(message)).openai_type
        return JSONResponse(status_code=404, content=error_body(message, kind, None, "wrong_base_url"))

    for path in wrong_prefix_paths(prefix):
        app.add_api_route(path, wrong_prefix, methods=["GET", "POST"], include_in_schema=False)


# Response headers a browser client may read (CORS hides all but a few by default).
EXPOSED_HEADERS = (
    "x-request-id", MODEL_REVISION_HEADER, "x-semserve-cache", "x-semserve-cache-similarity",
    # Per-tenant limits (transformers_svc/admission.py): a browser client can pace itself.
    "retry-after", *(f"x-ratelimit-{what}-{limit}" for what in ("limit", "remaining", "reset")
                     for limit in ("requests", "tokens")),
)


def with_cors(app: Any, origins: list[str]) -> Any:
    """The ASGI app with CORS for `origins` (["*"]: any), or the app unchanged when there are none.
    Wrap it outside any auth layer: a browser's preflight OPTIONS carries no API key."""
    if not origins:
        return app
    from starlette.middleware.cors import CORSMiddleware

    return CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=["GET", "POST", "OPTIONS"],
        allow_headers=["*"],
        expose_headers=list(EXPOSED_HEADERS),
        max_age=600,
    )
