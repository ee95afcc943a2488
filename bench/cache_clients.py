"""The load clients of `semserve bench cache`: v2 REST (httpx) and v2 gRPC (grpc.aio) to one
target, returning the cache status of each answer."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import httpx

MODEL = "llm"


def cache_status(r: httpx.Response) -> str:
    """A v2 answer's cache status (`direct`: the predictor's, which has none); raises on an error."""
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
    for out in r.json()["outputs"]:
        if out["name"] == "cache_status":
            return str(out["data"][0])
    return "direct"


@dataclass(frozen=True)
class Target:
    name: str  # "transformer" | "predictor"
    http: str  # base URL
    grpc: str  # host:port


def _grpc_cache_status(resp: Any) -> str:
    for i, out in enumerate(resp.outputs):
        if out.name != "cache_status":
            continue
        if resp.raw_output_contents:
            raw = resp.raw_output_contents[i]
            (n,) = struct.unpack_from("<I", raw, 0)
            return bytes(raw[4 : 4 + n]).decode()
        return bytes(out.contents.bytes_contents[0]).decode()
    return "direct"


class Clients:
    """One httpx client and one gRPC channel per target, shared by all workers (as a real client
    pool would be). `call` returns the cache status of the answer ("direct" from the predictor)."""

    def __init__(self, max_tokens: int) -> None:
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

        self.pb = pb
        self.max_tokens = max_tokens
        self.http = httpx.AsyncClient(
            timeout=120, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
        )
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []

    def _stub(self, addr: str) -> Any:
        if addr not in self._stubs:
            import grpc
            from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

            channel = grpc.aio.insecure_channel(addr)
            self._channels.append(channel)
            self._stubs[addr] = pb_grpc.GRPCInferenceServiceStub(channel)
        return self._stubs[addr]

    async def call(self, target: Target, protocol: str, prompt: str,
                   headers: dict[str, str] | None = None) -> str:
        if protocol == "rest":
            body = {
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                "parameters": {"max_tokens": self.max_tokens, "temperature": 0},
            }
            return cache_status(await self.http.post(f"{target.http}/v2/models/{MODEL}/infer",
                                                     json=body, headers=headers or {}))
        pb = self.pb
        req = pb.ModelInferRequest(
            model_name=MODEL,
            inputs=[pb.ModelInferRequest.InferInputTensor(
                name="text_input", datatype="BYTES", shape=[1],
                contents=pb.InferTensorContents(bytes_contents=[prompt.encode()]),
            )],
            parameters={
                "max_tokens": pb.InferParameter(int64_param=self.max_tokens),
                "temperature": pb.InferParameter(int64_param=0),
            },
        )
        resp = await self._stub(target.grpc).ModelInfer(
            req, metadata=tuple((headers or {}).items()) or None, timeout=120
        )
        return _grpc_cache_status(resp)

    async def floor(self, target: Target, protocol: str) -> str:
        """The model-ready probe: the same server stack and client, no cache and no model work."""
        if protocol == "rest":
            r = await self.http.get(f"{target.http}/v2/models/{MODEL}/ready")
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        else:
            await self._stub(target.grpc).ModelReady(self.pb.ModelReadyRequest(name=MODEL), timeout=30)
        return "floor"

    async def close(self) -> None:
        await self.http.aclose()
        for ch in self._channels:
            await ch.close()
