"""The HTTP guard: pure ASGI middleware around the whole app that gives every request an id, holds
the body limit, decodes a compressed body, refuses new work while draining, counts what is in
flight, cancels the handler of a client that goes away, and logs and traces each request."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from semserve import tracing
from semserve.logs import get_logger, request_id_var
from semserve.serving.content_encoding import EncodingError, decode_body
from semserve.serving.spans import UNTRACED_PATHS, end_http_span, http_span
from semserve.serving.state import EXEMPT_PATHS, ServingState

log = get_logger("semserve.serving")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


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
        traced = None if path in UNTRACED_PATHS else http_span(scope, headers, rid)
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
            if headers.get("content-encoding"):
                try:
                    body = decode_body(body, headers["content-encoding"], self.max_body_bytes)
                except EncodingError as exc:
                    status_holder["status"] = exc.status
                    await _send_json(send, exc.status, {"error": str(exc)}, rid)
                    return
                scope = _decoded_scope(scope, len(body))
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
            end_http_span(traced, scope, status_holder["status"])
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


def _decoded_scope(scope: Scope, length: int) -> Scope:
    """The request as the app sees it once its body is decoded: no content-encoding, its length."""
    kept = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-encoding", b"content-length")]
    return {**scope, "headers": [*kept, (b"content-length", str(length).encode())]}


def _too_large(limit: int) -> dict[str, str]:
    return {"error": f"request body is larger than the limit of {limit} bytes"}

