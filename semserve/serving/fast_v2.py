"""A lean v2 REST path: `POST /v2/models/{name}/infer`, `GET /v2/models/{name}/ready` and the two
health probes answered before FastAPI and KServe's app, for the served model's exact paths.

Most of a cache hit over REST was the HTTP stack around the model, not the model: FastAPI's
routing and dependency solving, KServe's middleware, and `jsonable_encoder` over the response
(~80 us alone). This layer sits innermost (inside the guard, auth and CORS, so request ids, the
body limit, draining, auth, spans, metrics and logs apply as before) and runs the same steps as
KServe's endpoint with the same objects: the body parsed as Starlette parses it (`json.loads`) and
validated by KServe's own `InferenceRequest`, the request decoded, inferred and encoded by the
same DataPlane calls, the response rendered as FastAPI renders it (its model dumped to JSON mode,
then `ORJSONResponse`'s orjson options). Errors are answered by the app's own exception handlers.

Whatever it cannot answer exactly like KServe's route falls through to it unchanged, body
included: a content type other than JSON, the binary tensor extension, CloudEvents, requested
outputs, a body that does not validate, a model that is not ready, any path but the served
model's own.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from fastapi import FastAPI
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER, PredictorProtocol
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.rest.v2_datamodels import InferenceRequest, InferenceResponse
from kserve.protocol.rest.v2_endpoints import V2Endpoints
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Match

from semserve.serving import v2_render

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Kind = Literal["infer", "model_ready", "live", "ready"]

_JSON_HEADERS = (b"content-type", b"application/json")
_REST_V2 = PredictorProtocol.REST_V2.value


@dataclass(frozen=True)
class FastRoute:
    """One path this layer answers: what it is, KServe's route for it (the span's http.route),
    and the model it names."""

    kind: Kind
    route: Any
    model: str = ""

    @property
    def untyped_is_json(self) -> bool:
        return not _strict_content_type(self.route)


@dataclass(frozen=True)
class Reply:
    """A 200 answer: its body and every header of it (uvicorn adds date and server)."""

    body: bytes
    headers: list[tuple[bytes, bytes]]

    @classmethod
    def json(cls, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> Reply:
        # Starlette's JSONResponse headers, in its order, then the model's own.
        return cls(body, [(b"content-length", str(len(body)).encode()), _JSON_HEADERS, *(extra or [])])


def _first_headers(scope: Scope) -> dict[str, str]:
    """The request headers as `dict(request.headers)` gives KServe: lowercase names (uvicorn's),
    the first value of a repeated one."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1")
        if name not in headers:
            headers[name] = value.decode("latin-1")
    return headers


def _json_body_type(headers: dict[str, str], untyped_is_json: bool) -> bool:
    """Whether FastAPI reads this body as JSON the plain way: application/json (other +json types
    mean CloudEvents to KServe), or no content type where the route is not strict about it."""
    value = headers.get("content-type")
    if not value:
        return untyped_is_json
    return value.split(";", 1)[0].strip().lower() == "application/json"


def _strict_content_type(route: Any) -> bool:
    """FastAPI's strict_content_type of the route (a body without a content type is not JSON)."""
    value = getattr(route, "strict_content_type", True)
    return bool(getattr(value, "value", value))


def _bypassed(headers: dict[str, str]) -> bool:
    """Requests KServe treats specially by header: binary tensors, binary CloudEvents."""
    return INFERENCE_CONTENT_LENGTH_HEADER in headers or any(k.startswith("ce-") for k in headers)


class FastV2:
    """Pure ASGI layer in front of KServe's FastAPI app (see the module docstring)."""

    def __init__(self, app: FastAPI, dataplane: DataPlane) -> None:
        self.app = app
        self.dataplane = dataplane
        self.routes = self._fast_routes()

    def _fast_routes(self) -> dict[tuple[str, str], FastRoute]:
        """Each (method, path) this layer answers, where the app's router would pick KServe's own
        endpoint for it (a route registered before KServe's that takes the path keeps it)."""
        wanted: list[tuple[str, str, Kind, Any, str]] = [
            ("GET", "/v2/health/live", "live", V2Endpoints.live, ""),
            ("GET", "/v2/health/ready", "ready", V2Endpoints.ready, ""),
        ]
        for name in self.dataplane.model_registry.get_models():
            wanted += [
                ("POST", f"/v2/models/{name}/infer", "infer", V2Endpoints.infer, name),
                ("GET", f"/v2/models/{name}/ready", "model_ready", V2Endpoints.model_ready, name),
            ]
        routes: dict[tuple[str, str], FastRoute] = {}
        for method, path, kind, endpoint, model in wanted:
            route = self._route_for(method, path)
            if route is not None and getattr(route.endpoint, "__func__", None) is endpoint:
                routes[(method, path)] = FastRoute(kind, route, model)
        return routes

    def _route_for(self, method: str, path: str) -> Any:
        scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
        for route in self.app.router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route
            if match == Match.PARTIAL:  # the path with another method: the router would say 405
                return None
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = None
        if scope["type"] == "http" and not scope.get("root_path"):
            fast = self.routes.get((scope["method"], scope["path"]))
        if fast is None:
            await self.app(scope, receive, send)
        elif fast.kind == "infer":
            await self._infer(fast, scope, receive, send)
        else:
            await self._probe(fast, scope, receive, send)

    # -- probes ---------------------------------------------------------------------------------

    async def _probe(self, fast: FastRoute, scope: Scope, receive: Receive, send: Send) -> None:
        """Success answered here; anything else (not ready, not found) by KServe's route."""
        body: bytes | None = None
        try:
            if fast.kind == "live":
                if (await self.dataplane.live())["status"] == "alive":
                    body = b'{"live":true}'
            elif fast.kind == "ready":
                if await self.dataplane.ready():
                    body = b'{"ready":true}'
            elif await self.dataplane.model_ready(fast.model):
                body = orjson.dumps({"name": fast.model, "ready": True})
        except Exception:  # KServe's route raises it again and answers it its way
            body = None
        if body is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = fast.route
        await _send(send, Reply.json(body))

    # -- infer ----------------------------------------------------------------------------------

    async def _infer(self, fast: FastRoute, scope: Scope, receive: Receive, send: Send) -> None:
        messages = await _read_body(receive)
        replay = _replaying(messages, receive)
        headers = _first_headers(scope)
        request = self._request(headers, messages, fast.untyped_is_json)
        if request is None or not await self._ready(fast.model):
            await self.app(scope, replay, send)
            return
        scope["route"] = fast.route
        try:
            reply = await self._answer(fast.model, request, headers)
        except Exception as exc:
            await self._error(scope, replay, send, exc)
            return
        await _send(send, reply)

    def _request(
        self, headers: dict[str, str], messages: list[Message], untyped_is_json: bool
    ) -> InferenceRequest | None:
        """KServe's InferenceRequest as FastAPI would hand it to the endpoint, or None where the
        route must decide (not plain JSON, not valid, or asking for what only it handles)."""
        if messages[-1]["type"] != "http.request" or _bypassed(headers):
            return None
        if not _json_body_type(headers, untyped_is_json):
            return None
        body = b"".join(m.get("body", b"") for m in messages)
        if not body:
            return None
        try:
            parsed = json.loads(body)  # Starlette's Request.json(): the same values, always
            if not isinstance(parsed, dict) or parsed.get("outputs") is not None:
                return None
            return InferenceRequest.model_validate(parsed)
        except (ValueError, RecursionError):  # invalid JSON, nested too deep, ValidationError
            return None

    async def _ready(self, model: str) -> bool:
        try:
            # As KServe's infer endpoint asks it: the predictor's health is not checked per request.
            return bool(await self.dataplane.model_ready(model, True))
        except Exception:
            return False

    async def _answer(self, model: str, body: InferenceRequest, headers: dict[str, str]) -> Reply:
        """KServe's V2Endpoints.infer after its readiness check: decode, infer, encode."""
        request, _ = self.dataplane.decode(body, headers, protocol_version=_REST_V2, model_name=model)
        response, response_headers = await self.dataplane.infer(
            model_name=model, request=request, headers=headers
        )
        content = v2_render.plain_content(response)
        if content is not None:  # what encoding and rendering would make of it, made directly
            return Reply.json(v2_render.dumps(content), _model_headers(response_headers))
        response, res_headers = self.dataplane.encode(
            model_name=model, response=response, headers=headers, req_attributes={}
        )
        response_headers.update(res_headers)
        if isinstance(response, bytes):
            # Binary outputs: KServe answers them in its bare Response, with no content type or length.
            return Reply(response, _model_headers(response_headers))
        rendered = v2_render.render(InferenceResponse.model_validate(response))
        return Reply.json(rendered, _model_headers(response_headers))

    async def _error(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """As Starlette's exception middlewares answer it: the app's handler for the nearest
        class; an unhandled error gets the 500 handler's answer and is raised again."""
        handler, unhandled = self._handler_for(exc)
        if handler is None:
            raise exc
        answer = handler(Request(scope, receive), exc)
        response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)
        if unhandled:
            raise exc

    def _handler_for(self, exc: Exception) -> tuple[Any, bool]:
        handlers = self.app.exception_handlers
        if isinstance(exc, HTTPException) and exc.status_code in handlers:
            return handlers[exc.status_code], False
        for cls in type(exc).__mro__:
            if cls is Exception:
                break
            if cls in handlers:
                return handlers[cls], False
        return handlers.get(500) or handlers.get(Exception), True


def _model_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The headers the model's answer adds, as KServe's route adds them to its response."""
    merged: dict[str, str] = {}
    for key, value in headers.items():
        if key not in ("content-length", "content-type"):  # KServe drops exactly these keys
            merged[key.lower()] = str(value)  # Starlette's MutableHeaders.update
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in merged.items()]


async def _read_body(receive: Receive) -> list[Message]:
    """The request's body messages up to its last one (or the client's disconnect)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives the app the messages already read, then whatever the client does next."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _send(send: Send, reply: Reply) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body})
