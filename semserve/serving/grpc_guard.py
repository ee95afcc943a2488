"""The gRPC guard: an interceptor that refuses new calls while draining, counts what is in flight,
and gives every call a request id, a log line and a server span; and the interceptor base it and the
transformer's gRPC auth share."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from semserve.logs import get_logger, request_id_var
from semserve.serving.spans import end_grpc_span, grpc_span, grpc_traceresponse
from semserve.serving.state import ServingState

log = get_logger("semserve.serving")

# Probes: never refused, counted, logged, traced or asked for a key (as the HTTP probes), or a
# draining pod, or a kubelet without an API key, could not be told its state.
PROBES = ("/ServerLive", "/ServerReady", "/grpc.health.v1.Health/Check")

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
        wrapped: Any
        if handler.unary_unary is not None:
            wrapped = self.wrap(details.method, metadata, handler.unary_unary)
            make = grpc.unary_unary_rpc_method_handler
        elif handler.stream_stream is not None:
            wrapped = self.wrap_stream(details.method, metadata, handler.stream_stream)
            make = grpc.stream_stream_rpc_method_handler
        else:
            return handler
        if wrapped is None:
            return handler
        return make(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def wrap(self, method: str, metadata: tuple[Any, ...], inner: UnaryCall) -> UnaryCall | None:
        """The call to run instead of `inner`, or None to leave this method alone."""
        raise NotImplementedError

    def wrap_stream(
        self, method: str, metadata: tuple[Any, ...], inner: StreamCall
    ) -> StreamCall | None:
        """The stream handler to run instead of `inner`, or None to leave this method alone."""
        raise NotImplementedError


@dataclass
class _GuardedCall:
    """One call as the guard sees it: its span, and how it ended for the log line and the span."""

    traced: Any
    code: str = "OK"
    responses: int = 0


class GrpcGuard(CallInterceptor):
    """Drain refusal, in-flight count, request id, log line and server span for every call."""

    def __init__(self, state: ServingState) -> None:
        self.state = state

    def wrap(self, method: str, metadata_items: tuple[Any, ...], inner: UnaryCall) -> UnaryCall:
        metadata = dict(metadata_items)
        rid = str(metadata.get("x-request-id") or uuid.uuid4().hex)
        probe = method.endswith(PROBES)

        async def call(request: Any, context: aio.ServicerContext) -> Any:
            token = request_id_var.set(rid)
            try:
                if probe:
                    return await inner(request, context)
                async with self._guard("grpc_request", method, metadata, rid, context) as guarded:
                    response = await inner(request, context)
                    grpc_traceresponse(guarded.traced, context)
                    return response
            finally:
                request_id_var.reset(token)

        return call

    def wrap_stream(self, method: str, metadata_items: tuple[Any, ...], inner: StreamCall) -> StreamCall:
        metadata = dict(metadata_items)
        rid = str(metadata.get("x-request-id") or uuid.uuid4().hex)

        async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext) -> AsyncIterator[Any]:
            # An async generator's context is its consumer's: grpc runs this one in the call's own
            # task, so the request id and span set here reach the handler and its tasks.
            request_id_var.set(rid)
            async with self._guard("grpc_stream", method, metadata, rid, context) as guarded:
                async for response in inner(requests, context):
                    guarded.responses += 1
                    yield response
                grpc_traceresponse(guarded.traced, context)

        return stream

    @contextlib.asynccontextmanager
    async def _guard(
        self, event: str, method: str, metadata: dict[str, Any], rid: str, context: aio.ServicerContext
    ) -> AsyncIterator[_GuardedCall]:
        """What unary calls and streams share: refused while draining, counted while in flight,
        one log line `event` and the server span when done."""
        started = time.monotonic()
        guarded = _GuardedCall(grpc_span(method, metadata, rid, context))
        try:
            if self.state.draining:
                guarded.code = "UNAVAILABLE"
                await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
            self.state.enter()
            try:
                yield guarded
            except (asyncio.CancelledError, GeneratorExit):
                guarded.code = "CANCELLED"
                raise
            except Exception:
                guarded.code = "ERROR"
                raise
            finally:
                self.state.leave()
        finally:
            counts = {"responses": guarded.responses} if event == "grpc_stream" else {}
            log.info(
                event,
                method=method,
                code=guarded.code,
                **counts,
                duration_ms=round((time.monotonic() - started) * 1000, 2),
            )
            end_grpc_span(guarded.traced, context, guarded.code)
