"""Serving runtime both services share: a kserve.ModelServer that binds a chosen address, guards
every HTTP and gRPC request (request id, body limit, disconnect -> cancel, drain), and shuts down
gracefully on SIGTERM, since Knative scales pods down while they serve.

SIGTERM: readiness turns false and new requests get 503 at once; requests in flight finish (up to
the grace period); then both servers stop, engines are shut down and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from concurrent import futures
from typing import Any

import grpc
import kserve
import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from grpc import aio
from kserve.errors import InferenceError, InvalidInput, ModelNotFound, ServerNotReady
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension
from kserve.protocol.rest.server import RESTServer

from semserve import http_limits, kserve_rest, tracing
from semserve.logs import get_logger, request_id_var
from semserve.oip import service as oip_service

log = get_logger("semserve.serving")

# Probes and scrapes are never refused or counted as work, or a draining pod could not report it.
EXEMPT_PATHS = ("/v2/health/live", "/v2/health/ready", "/metrics", "/")
# Not traced either: probes would flood the traces, and reading spans must not make new ones.
UNTRACED_PATHS = (*EXEMPT_PATHS, tracing.DEBUG_SPANS_PATH)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


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


class ServingState:
    """Drain flag and in-flight count shared by the HTTP and gRPC guards."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, limit_s: float) -> bool:
        try:
            async with asyncio.timeout(limit_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False


async def _send_json(send: Send, status: int, body: dict[str, Any], rid: str) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"x-request-id", rid.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class HttpGuard:
    """Pure ASGI middleware around the whole app.

    It reads the body up front (so the size limit holds before any parsing), then watches the
    connection: a client that goes away cancels its handler, which aborts the vLLM request.
    """

    def __init__(self, app: Any, state: ServingState, max_body_bytes: int) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rid = headers.get("x-request-id") or uuid.uuid4().hex
        token = request_id_var.set(rid)
        path = scope["path"]
        exempt = path in EXEMPT_PATHS
        started = time.monotonic()
        status_holder = {"status": 0}
        traced = None if path in UNTRACED_PATHS else _http_span(scope, headers, rid)
        try:
            if self.state.draining and not exempt:
                status_holder["status"] = 503
                await _send_json(send, 503, {"error": "server is shutting down"}, rid)
                return
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
                status_holder["status"] = 413
                await _send_json(send, 413, _too_large(self.max_body_bytes), rid)
                return
            body, disconnected = await self._read_body(receive)
            if disconnected:
                return
            if body is None:
                status_holder["status"] = 413
                await _send_json(send, 413, _too_large(self.max_body_bytes), rid)
                return
            if not exempt:
                self.state.enter()
            try:
                await self._run(scope, receive, send, body, rid, status_holder)
            finally:
                if not exempt:
                    self.state.leave()
        finally:
            if not exempt:
                log.info(
                    "http_request",
                    method=scope.get("method"),
                    path=path,
                    status=status_holder["status"],
                    duration_ms=round((time.monotonic() - started) * 1000, 2),
                )
            _end_http_span(traced, scope, status_holder["status"])
            request_id_var.reset(token)

    async def _read_body(self, receive: Receive) -> tuple[bytes | None, bool]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None, False
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), False

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, body: bytes, rid: str, status: dict[str, int]
    ) -> None:
        disconnected = asyncio.Event()
        replayed = False
        # Once the last body message is on its way, uvicorn's receive() answers http.disconnect at
        # once: that is the response being complete, not a client leaving. Cancelling then would
        # cut the app's own tail (logs, audit) and log a delivered 200 as a 499.
        completed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal completed
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            if message["type"] == "http.response.start":
                status["status"] = message["status"]
                message = dict(message)
                extra = [(b"x-request-id", rid.encode())]
                answer = tracing.traceresponse(tracing.trace.get_current_span())
                if answer is not None:
                    extra.append((b"traceresponse", answer.encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        app_task = asyncio.ensure_future(self.app(scope, replay, send_with_id))

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    if not app_task.done() and not completed:
                        log.info("client_disconnected", path=scope["path"])
                        app_task.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await app_task
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise
            status["status"] = 499  # nginx's "client closed request": nobody is left to answer
        finally:
            watcher.cancel()


def _http_span(scope: Scope, headers: dict[str, str], rid: str) -> Any:
    """The request's SERVER span (HTTP semantic conventions), continuing a client's traceparent."""
    if not tracing.enabled():
        return None
    method = scope.get("method", "GET")
    server = scope.get("server") or ("", 0)
    client = scope.get("client") or ("", 0)
    return tracing.start_server_span(
        method,  # renamed to "METHOD /route/template" once routing has matched
        headers,
        {
            "http.request.method": method,
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "server.address": str(server[0]),
            "server.port": int(server[1] or 0),
            "client.address": str(client[0]),
            "network.protocol.name": "http",
            "network.protocol.version": str(scope.get("http_version", "1.1")),
            "user_agent.original": headers.get("user-agent", ""),
            "semserve.request_id": rid,
        },
    )


def _end_http_span(traced: Any, scope: Scope, status: int) -> None:
    if traced is None:
        return
    span = traced[0]
    # FastAPI's router leaves the matched route in the scope it was given (the one we passed down).
    route = getattr(scope.get("route"), "path", None)
    if route:
        span.set_attribute("http.route", route)
        span.update_name(f"{scope.get('method', 'GET')} {route}")
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
    # 4xx are the client's errors: not a server span error (HTTP semantic conventions).
    tracing.end_server_span(traced, error=status >= 500)


def _too_large(limit: int) -> dict[str, str]:
    return {"error": f"request body is larger than the limit of {limit} bytes"}


UnaryCall = Callable[[Any, aio.ServicerContext], Awaitable[Any]]
StreamCall = Callable[[AsyncIterator[Any], aio.ServicerContext], AsyncIterator[Any]]


class CallInterceptor(aio.ServerInterceptor):
    """Base for interceptors that wrap the behaviour of unary calls and of bidirectional streams
    (v2's RPCs are unary; ModelStreamInfer is a stream). A subclass that lets streams through
    unwrapped must say so: `wrap_stream` has no default."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        metadata = tuple(details.invocation_metadata or ())
        if handler.unary_unary is not None:
            call = self.wrap(details.method, metadata, handler.unary_unary)
            if call is None:
                return handler
            return grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            stream = self.wrap_stream(details.method, metadata, handler.stream_stream)
            if stream is None:
                return handler
            return grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def wrap(self, method: str, metadata: tuple[Any, ...], inner: UnaryCall) -> UnaryCall | None:
        """The call to run instead of `inner`, or None to leave this method alone."""
        raise NotImplementedError

    def wrap_stream(
        self, method: str, metadata: tuple[Any, ...], inner: StreamCall
    ) -> StreamCall | None:
        """The stream handler to run instead of `inner`, or None to leave this method alone."""
        raise NotImplementedError


class GrpcGuard(CallInterceptor):
    """Drain refusal, in-flight count, request id, log line and server span for every call."""

    def __init__(self, state: ServingState) -> None:
        self.state = state

    def wrap(self, method: str, metadata_items: tuple[Any, ...], inner: UnaryCall) -> UnaryCall:
        guarded = not method.endswith(("/ServerLive", "/ServerReady"))
        metadata = dict(metadata_items)
        rid = str(metadata.get("x-request-id") or uuid.uuid4().hex)

        async def call(request: Any, context: aio.ServicerContext) -> Any:
            token = request_id_var.set(rid)
            started = time.monotonic()
            code = "OK"
            traced = _grpc_span(method, metadata, rid, context) if guarded else None
            try:
                if guarded and self.state.draining:
                    code = "UNAVAILABLE"
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
                if guarded:
                    self.state.enter()
                try:
                    response = await inner(request, context)
                    _grpc_traceresponse(traced, context)
                    return response
                except asyncio.CancelledError:
                    code = "CANCELLED"
                    raise
                except Exception:
                    code = "ERROR"
                    raise
                finally:
                    if guarded:
                        self.state.leave()
            finally:
                if guarded:
                    log.info(
                        "grpc_request",
                        method=method,
                        code=code,
                        duration_ms=round((time.monotonic() - started) * 1000, 2),
                    )
                _end_grpc_span(traced, context, code)
                request_id_var.reset(token)

        return call

    def wrap_stream(self, method: str, metadata_items: tuple[Any, ...], inner: StreamCall) -> StreamCall:
        metadata = dict(metadata_items)
        rid = str(metadata.get("x-request-id") or uuid.uuid4().hex)

        async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext) -> AsyncIterator[Any]:
            # An async generator's context is its consumer's: grpc runs this one in the call's own
            # task, so the request id and span set here reach the handler and its tasks.
            request_id_var.set(rid)
            started = time.monotonic()
            code = "OK"
            responses = 0
            traced = _grpc_span(method, metadata, rid, context)
            try:
                if self.state.draining:
                    code = "UNAVAILABLE"
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
                self.state.enter()
                try:
                    async for response in inner(requests, context):
                        responses += 1
                        yield response
                    _grpc_traceresponse(traced, context)
                except (asyncio.CancelledError, GeneratorExit):
                    code = "CANCELLED"
                    raise
                except Exception:
                    code = "ERROR"
                    raise
                finally:
                    self.state.leave()
            finally:
                log.info(
                    "grpc_stream",
                    method=method,
                    code=code,
                    responses=responses,
                    duration_ms=round((time.monotonic() - started) * 1000, 2),
                )
                _end_grpc_span(traced, context, code)

        return stream


def _grpc_span(method: str, metadata: dict[str, Any], rid: str, context: aio.ServicerContext) -> Any:
    """The call's SERVER span (RPC semantic conventions), continuing the caller's traceparent."""
    if not tracing.enabled():
        return None
    service, _, name = method.lstrip("/").rpartition("/")
    carrier = {str(k).lower(): v for k, v in metadata.items() if isinstance(v, str)}
    traced = tracing.start_server_span(
        method.lstrip("/"),
        carrier,
        {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "network.protocol.name": "http",
            "network.protocol.version": "2",
            "client.address": (context.peer() or "").rpartition(":")[0],
            "semserve.request_id": rid,
        },
    )
    return traced


def _grpc_traceresponse(traced: Any, context: aio.ServicerContext) -> None:
    """The server span back to the caller in the trailing metadata, like the HTTP traceresponse
    header. Set only once the handler has returned: KServe's servicer reads the trailing metadata
    as request headers and expects grpc's own metadatum objects there."""
    answer = tracing.traceresponse(traced[0]) if traced else None
    if answer is not None:
        with contextlib.suppress(Exception):
            context.set_trailing_metadata((("traceresponse", answer),))


# Names of grpc.StatusCode by our guard's outcome when the context cannot tell (older grpcio).
_GRPC_CODES = {"OK": 0, "CANCELLED": 1, "ERROR": 2, "UNAVAILABLE": 14}


def _end_grpc_span(traced: Any, context: aio.ServicerContext, outcome: str) -> None:
    if traced is None:
        return
    code: Any = None
    with contextlib.suppress(Exception):
        code = context.code()  # set by abort() (KServe's interceptor turns errors into aborts)
    value = code.value[0] if isinstance(code, grpc.StatusCode) else (
        int(code) if isinstance(code, int) else _GRPC_CODES.get(outcome, 2)
    )
    traced[0].set_attribute("rpc.grpc.status_code", value)
    # RPC semantic conventions: server spans are errors for these codes only.
    error = value in (2, 4, 12, 13, 14, 15)
    tracing.end_server_span(traced, error=error)


class _ReadinessDataPlane(DataPlane):
    """KServe's server readiness is always true; ours is false while draining or loading."""

    def __init__(self, state: ServingState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state = state

    async def ready(self) -> bool:
        if self._state.draining:
            return False
        for model in self._model_registry.get_models().values():
            if not await model.healthy():
                return False
        return await super().ready()

    def decode_inference_request(self, body: Any, headers: Any, model_name: str) -> Any:
        # KServe's decoding of a client's body (the binary tensor extension above all) raises
        # TypeError/KeyError/ValueError on malformed input, e.g. a JSON header that is `null` or a
        # non-numeric inference-header-content-length; those are the client's error, a 400.
        try:
            return super().decode_inference_request(body, headers, model_name)
        except (InferenceError, InvalidInput):
            raise
        except Exception as exc:
            raise InvalidInput(f"malformed inference request: {type(exc).__name__}: {exc}") from None


class _ServedModels(ModelRepositoryExtension):
    """KServe's model repository extension (v2 `/v2/repository/models/{name}/load|unload` and their
    gRPC twins) for a server whose models are fixed at start: one pod serves one model from start to
    exit, and Knative scales pods, not models.

    KServe's own answers `load` of a name it does not serve with 503 "not ready" (its registry's
    load is a no-op), and lets any client `unload` the served model, after which the pod stays ready
    while every request fails with 404."""

    async def load(self, model_name: str) -> None:
        if self._model_registry.get_model(model_name) is None:
            raise ModelNotFound(model_name)
        await super().load(model_name)  # already loaded: 200, or 503 while the engine still starts

    async def unload(self, model_name: str) -> None:
        if self._model_registry.get_model(model_name) is None:
            raise ModelNotFound(model_name)
        raise InvalidInput(
            f"model control is disabled: this server serves {model_name!r} until it exits "
            "and cannot unload it (scale with replicas instead)"
        )


class _QuietServer(uvicorn.Server):
    # Signals are ours: uvicorn's handler would stop accepting before readiness turned false.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


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


class SemserveModelServer(kserve.ModelServer):
    """kserve.ModelServer with our bind address, guards and graceful drain."""

    def __init__(
        self,
        *,
        host: str,
        http_port: int,
        grpc_port: int,
        grace_period: float,
        max_body_bytes: int,
        max_header_bytes: int = http_limits.DEFAULT_MAX_HEADER_BYTES,
        setup_app: Callable[[FastAPI], None] | None = None,
        wrap_app: Callable[[Any], Any] | None = None,
        grpc_interceptors: tuple[aio.ServerInterceptor, ...] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(
            http_port=http_port,
            grpc_port=grpc_port or 8081,
            enable_grpc=grpc_port > 0,
            grace_period=int(grace_period),
            enable_latency_logging=False,
            **kwargs,
        )
        self.state = ServingState()
        self.dataplane = _ReadinessDataPlane(self.state, model_registry=self.registered_models)
        self.model_repository_extension = _ServedModels(model_registry=self.registered_models)
        self.host = host
        self.grace = grace_period
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.setup_app = setup_app
        # An inner ASGI layer (e.g. the transformer's auth), run inside the guard.
        self.wrap_app = wrap_app
        self.grpc_interceptors = grpc_interceptors
        self._uvicorn: _QuietServer | None = None
        self._grpc: aio.Server | None = None
        self._stopped = asyncio.Event()
        self._models: list[kserve.Model] = []
        self._drain_task: asyncio.Future[None] | None = None

    def start(self, models: list[Any]) -> None:  # type: ignore[override]
        asyncio.run(self.serve(models))

    async def serve(self, models: list[Any]) -> None:
        self._models = models
        self._register_and_check_atleast_one_model_is_ready(models)
        app = self._build_app()
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.http_port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, int(self.grace)),
            timeout_keep_alive=self.timeout_keep_alive,
            loop="asyncio",
            # httptools alone buffers request heads of any size; ours answers 431 past the limit.
            **http_limits.uvicorn_options(self.max_header_bytes),
        )
        self._uvicorn = _QuietServer(config)
        tasks = [asyncio.ensure_future(self._uvicorn.serve())]
        if self.enable_grpc:
            tasks.append(asyncio.ensure_future(self._serve_grpc()))
        tasks.extend(asyncio.ensure_future(s) for s in self.servers)  # engine start coroutines
        self.setup_event_loop()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        log.info(
            "server_starting",
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port if self.enable_grpc else None,
        )
        # Models that can fail for good after starting (an engine process dying) say so by
        # raising from `watch()`; they run until the servers end and never hold up a shutdown.
        watchers = [
            asyncio.ensure_future(self._watch(m)) for m in models if callable(getattr(m, "watch", None))
        ]
        everything = asyncio.gather(*tasks)
        try:
            # A server that dies on its own (port taken, engine failure) ends the process.
            done, _ = await asyncio.wait([everything, *watchers], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in (*tasks, everything, *watchers):
                task.cancel()
            self._stop_models()

    async def _watch(self, model: Any) -> None:
        try:
            await model.watch()
        except Exception as exc:
            log.error("model_failed", model=getattr(model, "name", "?"), error=str(exc))
            # Readiness false and new requests refused at once; those in flight (failing fast
            # without the model) get their answers before the process ends.
            self.state.draining = True
            await self.state.wait_idle(min(self.grace, 5.0))
            raise

    def _build_app(self) -> Any:
        rest = RESTServer(
            "kserve.model_server:app",
            self.dataplane,
            self.model_repository_extension,
            self.http_port,
            grace_period=int(self.grace),
        )
        app: FastAPI = kserve.model_server.app
        if self.setup_app is not None:
            # Before KServe's routes, so ours win where a path is shared.
            self.setup_app(app)
        tracing.register_debug_routes(app)  # memory exporter only
        with kserve_rest.without_kserve_openai():  # KServe's OpenAI layer would import vLLM
            rest.create_application()
        app.add_exception_handler(RequestValidationError, _validation_error)
        # KServe raises InferenceError (a 500) while decoding tensors a client sent wrongly,
        # e.g. non-UTF-8 bytes in a JSON-encoded BYTES tensor; our models never raise it.
        app.add_exception_handler(InferenceError, _client_tensor_error)
        app.add_exception_handler(NotImplementedError, _not_supported)
        inner: Any = self.wrap_app(app) if self.wrap_app is not None else app
        return HttpGuard(inner, self.state, self.max_body_bytes)

    async def _serve_grpc(self) -> None:
        server = aio.server(
            futures.ThreadPoolExecutor(max_workers=self.max_threads),
            interceptors=(
                GrpcGuard(self.state), *self.grpc_interceptors, ExceptionToStatusInterceptor()
            ),
            options=[
                ("grpc.max_send_message_length", self.max_body_bytes),
                ("grpc.max_receive_message_length", self.max_body_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        # KServe's servicer for health, metadata and repository RPCs; ours for ModelInfer (raw
        # outputs, as Triton) and ModelStreamInfer (which KServe's proto lacks).
        server.add_generic_rpc_handlers((
            oip_service.generic_handler(
                self.dataplane, InferenceServicer(self.dataplane, self.model_repository_extension)
            ),
        ))
        address = f"{self.host}:{self.grpc_port}"
        if server.add_insecure_port(address) == 0:
            raise OSError(f"cannot bind gRPC to {address} (port in use?)")
        self._grpc = server
        await server.start()
        await server.wait_for_termination()

    def _on_signal(self, sig: int) -> None:
        if self.state.draining:
            return
        log.info("shutdown_signal", signal=signal.Signals(sig).name, in_flight=self.state.in_flight)
        self.state.draining = True
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        finished = await self.state.wait_idle(self.grace)
        log.info("drained", clean=finished, in_flight=self.state.in_flight)
        if self._grpc is not None:
            await self._grpc.stop(grace=1)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def _stop_models(self) -> None:
        for model in self._models:
            with contextlib.suppress(Exception):
                model.stop()
