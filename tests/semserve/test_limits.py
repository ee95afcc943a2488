"""Size limits, each with a clean status and no hang, on both services (README "Limits"):
request head (431), body (413), batch (400), prompt tokens (400, predictor), gRPC message and
metadata sizes (RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import httpx
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from tests.conftest import Predictor, Transformer


@pytest.fixture(params=["predictor", "transformer"])
def server(request: pytest.FixtureRequest, predictor: Predictor) -> Predictor | Transformer:
    return predictor if request.param == "predictor" else request.getfixturevalue("transformer")


def _raw(base: str, head: bytes, timeout: float = 30.0) -> bytes:
    """Send a raw request head; return the status line, or b"" if the server closed on us."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending: read what it said
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        return data.split(b"\r\n", 1)[0]


def _v2(prompts: list[str]) -> dict:
    return {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [len(prompts)], "data": prompts}],
            "parameters": {"max_tokens": 2, "temperature": 0}}


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_big_header_is_431(server: Predictor | Transformer, size: int) -> None:
    started = time.monotonic()
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    line = _raw(server.http, head)
    assert line == b"HTTP/1.1 431 Request Header Fields Too Large" or (size > 100_000 and line == b""), line
    assert time.monotonic() - started < 10
    assert httpx.get(f"{server.http}/v2/health/live", timeout=10).status_code == 200


def test_many_headers_are_431(server: Predictor | Transformer) -> None:
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-A: bbbbbbbb\r\n" * 10_000 + b"\r\n"
    assert _raw(server.http, head) == b"HTTP/1.1 431 Request Header Fields Too Large"


def test_header_below_limit_and_keep_alive_still_work(server: Predictor | Transformer) -> None:
    with httpx.Client(timeout=30) as client:
        for _ in range(3):  # one connection: each request's head is counted on its own
            r = client.get(f"{server.http}/v2/health/live", headers={"x-pad": "a" * 30_000})
            assert r.status_code == 200


def test_body_batch_limits(server: Predictor | Transformer) -> None:
    url = f"{server.http}/v2/models/llm/infer"
    too_many = httpx.post(url, json=_v2(["hi"] * 65), timeout=60)
    assert too_many.status_code == 400 and "at most" in too_many.text
    big = httpx.post(url, json=_v2(["x" * (5 * 1024 * 1024)]), timeout=60)
    assert big.status_code == 413 and "limit" in big.text
    # A declared length over the limit is refused before any of the body is read.
    line = _raw(server.http, b"POST /v2/models/llm/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n")
    assert line.startswith(b"HTTP/1.1 413")


def test_grpc_message_and_metadata_limits(server: Predictor | Transformer) -> None:
    async def codes() -> list[grpc.StatusCode]:
        out = []
        async with grpc.aio.insecure_channel(server.grpc, options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_metadata_size", 1024 * 1024),
        ]) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            big = pb.ModelInferRequest(model_name="llm")
            inp = big.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            inp.contents.bytes_contents.append(b"x" * (5 * 1024 * 1024))
            for request, metadata in ((big, None),
                                      (pb.ModelMetadataRequest(name="llm"), (("x-big", "a" * 100_000),))):
                try:
                    if isinstance(request, pb.ModelInferRequest):
                        await stub.ModelInfer(request, timeout=30)
                    else:
                        await stub.ModelMetadata(request, metadata=metadata, timeout=30)
                    out.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as err:
                    out.append(err.code())
        return out

    message, metadata = asyncio.run(codes())
    assert message == grpc.StatusCode.RESOURCE_EXHAUSTED
    # gRPC's own 8 KiB default metadata limit; the call is refused, never served or hung.
    assert metadata in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL,
                        grpc.StatusCode.UNAVAILABLE), metadata
