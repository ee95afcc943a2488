"""The SERVER span of each HTTP request and gRPC call (OpenTelemetry's HTTP and RPC semantic
conventions), continuing the caller's traceparent; the guards open and close them."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
from grpc import aio

from semserve import tracing
from semserve.serving.state import EXEMPT_PATHS

# Not traced either: probes would flood the traces, and reading spans must not make new ones.
UNTRACED_PATHS = (*EXEMPT_PATHS, tracing.DEBUG_SPANS_PATH)

# Names of grpc.StatusCode by our guard's outcome when the context cannot tell (older grpcio).
_GRPC_CODES = {"OK": 0, "CANCELLED": 1, "ERROR": 2, "UNAVAILABLE": 14}


def http_span(scope: dict[str, Any], headers: dict[str, str], rid: str) -> Any:
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


def end_http_span(traced: Any, scope: dict[str, Any], status: int) -> None:
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


def grpc_span(method: str, metadata: dict[str, Any], rid: str, context: aio.ServicerContext) -> Any:
    """The call's SERVER span (RPC semantic conventions), continuing the caller's traceparent."""
    if not tracing.enabled():
        return None
    service, _, name = method.lstrip("/").rpartition("/")
    carrier = {str(k).lower(): v for k, v in metadata.items() if isinstance(v, str)}
    return tracing.start_server_span(
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


def grpc_traceresponse(traced: Any, context: aio.ServicerContext) -> None:
    """The server span back to the caller in the trailing metadata, like the HTTP traceresponse
    header. Set only once the handler has returned: KServe's servicer reads the trailing metadata
    as request headers and expects grpc's own metadatum objects there."""
    answer = tracing.traceresponse(traced[0]) if traced else None
    if answer is not None:
        with contextlib.suppress(Exception):
            context.set_trailing_metadata((("traceresponse", answer),))


def end_grpc_span(traced: Any, context: aio.ServicerContext, outcome: str) -> None:
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
