"""Authentication on every route: an ASGI middleware for HTTP and a gRPC interceptor. Both put the
tenant in `tenant_var` for the handlers; probes and /metrics stay open so Kubernetes can use them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from semserve import tracing
from semserve.errors import ServingError
from semserve.openai_protocol import error_body
from semserve.serving import EXEMPT_PATHS, CallInterceptor, StreamCall, UnaryCall
from semserve.serving.grpc_guard import PROBES
from transformers_svc.auth import Authenticator, tenant_var


class HttpAuth:
    def __init__(self, app: Any, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["path"].startswith("/admin/"):
            # Admin routes check their own key (an admin key, not a tenant's).
            await self.app(scope, receive, send)
            return
        try:
            tenant = _authenticate(self.auth, headers)
        except ServingError as exc:
            await _reject(send, exc, openai=scope["path"].startswith("/openai/"))
            return
        token = tenant_var.set(tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            tenant_var.reset(token)


def _authenticate(auth: Authenticator, headers: dict[str, str]) -> str:
    """The tenant of the key, in an `auth` span; the tenant also goes on the request span."""
    with tracing.span("semserve.auth") as span:
        try:
            tenant = auth.tenant_for(headers)
        except ServingError as exc:
            span.set_attribute("semserve.auth.result", "rejected")
            tracing.fail(span, type(exc).__name__)
            raise
        span.set_attributes({"semserve.auth.result": "ok", "semserve.tenant": tenant})
    tracing.annotate(semserve__tenant=tenant)
    return tenant


async def _reject(send: Any, exc: ServingError, openai: bool) -> None:
    body = error_body(exc.message, exc.openai_type) if openai else {"error": exc.message}
    payload = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": exc.http_status,
        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
    })
    await send({"type": "http.response.body", "body": payload})


class GrpcAuth(CallInterceptor):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def wrap(self, method: str, metadata_items: tuple[Any, ...], inner: UnaryCall) -> UnaryCall | None:
        if method.endswith(PROBES):
            return None
        metadata = {k.lower(): v for k, v in metadata_items if isinstance(v, str)}

        async def call(request: Any, context: aio.ServicerContext) -> Any:
            try:
                tenant = _authenticate(self.auth, metadata)
            except ServingError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            token = tenant_var.set(tenant)
            try:
                return await inner(request, context)
            finally:
                tenant_var.reset(token)

        return call

    def wrap_stream(self, method: str, metadata_items: tuple[Any, ...], inner: StreamCall) -> StreamCall:
        metadata = {k.lower(): v for k, v in metadata_items if isinstance(v, str)}

        async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext) -> AsyncIterator[Any]:
            # Once per stream, before any request on it is read: the key is the stream's.
            try:
                tenant = _authenticate(self.auth, metadata)
            except ServingError as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            tenant_var.set(tenant)  # the call's own task: its requests' tasks inherit it
            async for response in inner(requests, context):
                yield response

        return stream
