"""gRPC's standard health service, through grpc's own health client: on both real services
(SERVING once ready, NOT_FOUND for a service it does not know, open to a caller with no API key),
and over a real aio server whose readiness a test flips (NOT_SERVING while not ready: loading or
draining; Watch sends each change)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from semserve.serving.grpc_health import add_health
from semserve.v2.grpc_service import SERVICE
from tests.conftest import Predictor, Transformer, start_transformer
from transformers_svc.auth import hash_key

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(params=["predictor", "transformer"])
def grpc_address(request: pytest.FixtureRequest) -> str:
    server: Predictor | Transformer = request.getfixturevalue(request.param)
    return server.grpc


def check(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=10).status  # fmt: skip


@pytest.mark.parametrize("service", ["", SERVICE])
def test_a_ready_service_is_serving(grpc_address: str, service: str) -> None:
    assert check(grpc_address, service) == SERVING


def test_an_unknown_service_is_not_found(grpc_address: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        check(grpc_address, "no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown service 'no.such.Service'" in caught.value.details()


def test_watch_sends_the_status_first(grpc_address: str) -> None:
    with grpc.insecure_channel(grpc_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(iter(watch)).status == SERVING
        watch.cancel()


def test_probes_need_no_api_key(predictor: Predictor, redis_url: str, tmp_path: Path) -> None:
    # A kubelet's gRPC probe sends no key; the inference RPCs still need one (test_transformer_faults).
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"acme": [hash_key("key-acme")]}))
    secured = start_transformer("health_auth", predictor.grpc, redis_url, "--api-keys-file", str(keys))
    try:
        assert check(secured.grpc, "") == SERVING
        with grpc.insecure_channel(secured.grpc) as channel, pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/inference.GRPCInferenceService/ServerMetadata")(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        secured.process.stop()


@pytest.fixture
async def flipped() -> AsyncIterator[tuple[str, list[bool]]]:
    ready = [False]

    async def readiness() -> bool:
        return ready[0]

    server = aio.server()
    add_health(server, readiness, (SERVICE,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", ready
    finally:
        await server.stop(0)


async def test_not_serving_until_ready_and_watch_follows(flipped: tuple[str, list[bool]]) -> None:
    address, ready = flipped
    async with aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert (await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE))).status == NOT_SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        seen = [(await watch.read()).status]
        ready[0] = True
        seen.append((await asyncio.wait_for(watch.read(), 5)).status)
        ready[0] = False  # draining
        seen.append((await asyncio.wait_for(watch.read(), 5)).status)
        watch.cancel()
        assert seen == [NOT_SERVING, SERVING, NOT_SERVING]
        unknown = stub.Watch(health_pb2.HealthCheckRequest(service="other"))
        assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        unknown.cancel()
