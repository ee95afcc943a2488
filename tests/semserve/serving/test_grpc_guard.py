"""The gRPC guard of both services, on a real grpc.aio server over loopback: unary calls and
streams are refused while draining (UNAVAILABLE), counted while in flight, and uncounted however
they end (answered, failed, or a stream the client cancels); probes pass even while draining."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from semserve.serving import GrpcGuard, ServingState
from tests.support import free_port

SERVICE = "test.Echo"


class Echo:
    """Unary `Say` (echo, or fail on b"fail"), `ServerReady` (a probe's name) and stream `Count`."""

    def __init__(self) -> None:
        self.stream_cancelled = asyncio.Event()
        self.seen_in_flight: list[int] = []
        self.state: ServingState | None = None

    async def say(self, request: bytes, context: aio.ServicerContext) -> bytes:
        assert self.state is not None
        self.seen_in_flight.append(self.state.in_flight)
        if request == b"fail":
            raise RuntimeError("boom")
        return request

    async def ready(self, request: bytes, context: aio.ServicerContext) -> bytes:
        return b"ready"

    async def count(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            try:
                for i in range(int(request)):
                    yield str(i).encode()
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.stream_cancelled.set()
                raise

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Say": grpc.unary_unary_rpc_method_handler(self.say),
            "ServerReady": grpc.unary_unary_rpc_method_handler(self.ready),
            "Count": grpc.stream_stream_rpc_method_handler(self.count),
        })


@contextlib.asynccontextmanager
async def guarded_server() -> AsyncIterator[tuple[aio.Channel, ServingState, Echo]]:
    state = ServingState()
    echo = Echo()
    echo.state = state
    server = aio.server(interceptors=(GrpcGuard(state),))
    server.add_generic_rpc_handlers((echo.handler(),))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, state, echo
    finally:
        await channel.close()
        await server.stop(grace=None)


def unary(channel: aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/{SERVICE}/{name}")


async def test_unary_calls_are_counted_while_in_flight_and_refused_while_draining() -> None:
    async with guarded_server() as (channel, state, echo):
        assert await unary(channel, "Say")(b"hi", timeout=5) == b"hi"
        with pytest.raises(aio.AioRpcError) as failed:
            await unary(channel, "Say")(b"fail", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNKNOWN
        assert echo.seen_in_flight == [1, 1] and state.in_flight == 0

        state.draining = True
        with pytest.raises(aio.AioRpcError) as refused:
            await unary(channel, "Say")(b"hi", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert echo.seen_in_flight == [1, 1], "a refused call must not reach the handler"
        # A probe passes while draining (readiness is the servicer's answer, not a refusal).
        assert await unary(channel, "ServerReady")(b"", timeout=5) == b"ready"
        assert state.in_flight == 0


async def test_streams_are_counted_until_they_end_or_the_client_cancels() -> None:
    async with guarded_server() as (channel, state, echo):
        count = channel.stream_stream(f"/{SERVICE}/Count")
        call = count(iter([b"3"]), timeout=5)
        assert [r async for r in call] == [b"0", b"1", b"2"]
        assert state.in_flight == 0

        call = count(iter([b"1000"]), timeout=30)
        assert await call.read() == b"0"
        assert state.in_flight == 1
        call.cancel()
        await asyncio.wait_for(echo.stream_cancelled.wait(), 5)
        for _ in range(100):
            if state.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert state.in_flight == 0

        state.draining = True
        with pytest.raises(aio.AioRpcError) as refused:
            _ = [r async for r in count(iter([b"3"]), timeout=5)]
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
