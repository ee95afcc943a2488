"""The HTTP guard of both services, on a real uvicorn over loopback: a client that leaves cancels
its handler; a response that is merely complete does not, even when the handler still has work
after its last byte (found by the soak: delivered 200s were logged as 499 and their tails cut)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import uvicorn

from semserve.serving.http_guard import HttpGuard
from semserve.serving.state import ServingState
from tests.support import free_port


class TailApp:
    """Answers at once, then keeps working for a while after the last body byte."""

    def __init__(self, tail_s: float) -> None:
        self.tail_s = tail_s
        self.tails_done = 0
        self.tails_cancelled = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        headers = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        try:
            await asyncio.sleep(self.tail_s)  # e.g. an audit line, metrics, a store after the answer
        except asyncio.CancelledError:
            self.tails_cancelled += 1
            raise
        self.tails_done += 1


class SlowApp:
    """Never answers in time: only a client leaving ends it."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(HttpGuard(app, ServingState(), 1 << 20), host="127.0.0.1",
                                           port=port, log_config=None, lifespan="off"))
    task = asyncio.ensure_future(server.serve())
    for _ in range(500):  # uvicorn offers no event for "listening"
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_a_complete_response_is_not_a_client_leaving() -> None:
    app = TailApp(tail_s=0.3)
    async with serving(app) as url, httpx.AsyncClient() as client:
        for _ in range(5):
            r = await client.post(url, content=b"x")
            assert r.status_code == 200 and r.text == "ok"
        await asyncio.sleep(0.6)
    assert (app.tails_done, app.tails_cancelled) == (5, 0)


async def test_a_client_that_leaves_cancels_its_handler() -> None:
    app = SlowApp()
    async with serving(app) as url:
        async with httpx.AsyncClient() as client:
            call = asyncio.ensure_future(client.post(url, content=b"x", timeout=30))
            await asyncio.sleep(0.3)
            call.cancel()  # closes the connection
            with contextlib.suppress(asyncio.CancelledError):
                await call
        await asyncio.wait_for(app.cancelled.wait(), 5)
