"""gRPC's standard health service (`grpc.health.v1.Health`), which Kubernetes' gRPC probes,
grpc_health_probe, Envoy and Istio ask: SERVING exactly when the server is ready (the model loaded,
not draining: the v2 ServerReady answer), NOT_SERVING otherwise. The service names it knows are ""
(the server) and the v2 inference service; any other is NOT_FOUND (Check) or SERVICE_UNKNOWN
(Watch), as the protocol says. Watch sends the status, then each change (read once a second)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_interceptor.exceptions import GrpcException

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
CHECK = "/grpc.health.v1.Health/Check"
WATCH_POLL_S = 1.0


class ReadinessHealth(health_pb2_grpc.HealthServicer):
    """The health service over a readiness check (`ready`: the data plane's)."""

    def __init__(self, ready: Callable[[], Awaitable[bool]], services: tuple[str, ...]) -> None:
        self._ready = ready
        self._services = ("", *services)

    async def _status(self, service: str) -> int:
        if service not in self._services:
            return SERVICE_UNKNOWN
        try:
            return SERVING if await self._ready() else NOT_SERVING
        except Exception:  # a readiness check that fails is a server that is not ready
            return NOT_SERVING

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = await self._status(request.service)
        if status == SERVICE_UNKNOWN:
            # Raised, not `context.abort`: KServe's interceptor logs an abort as an internal error.
            raise GrpcException(f"unknown service {request.service!r}", grpc.StatusCode.NOT_FOUND)
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = await self._status(request.service)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(WATCH_POLL_S)


def add_health(server: aio.Server, ready: Callable[[], Awaitable[bool]], services: tuple[str, ...]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(ReadinessHealth(ready, services), server)
