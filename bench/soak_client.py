"""The client of `semserve bench soak`: one request on any of its paths (v2 REST, v2 gRPC,
OpenAI completions/chat, streaming or not) through the transformer, read back as Served."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import httpx

from bench.soak_verify import Served

MODEL = "llm"
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Endpoint:
    http: str  # base URL
    grpc: str  # host:port


def _grpc_output(resp: Any, name: str) -> bytes | None:
    """The first element of a BYTES or INT32 output, raw (raw_output_contents or typed contents)."""
    for i, out in enumerate(resp.outputs):
        if out.name != name:
            continue
        if resp.raw_output_contents:
            raw = bytes(resp.raw_output_contents[i])
            if out.datatype == "BYTES":
                (n,) = struct.unpack_from("<I", raw, 0)
                return raw[4 : 4 + n]
            return raw[:4]
        if out.datatype == "BYTES":
            return bytes(out.contents.bytes_contents[0])
        return struct.pack("<i", out.contents.int_contents[0])
    return None


class Failure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind



class Client:
    def __init__(self, transformer: Endpoint) -> None:
        import grpc
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

        self.t, self.pb = transformer, pb
        self.http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S,
                                      limits=httpx.Limits(max_connections=128, max_keepalive_connections=64))
        self.channel = grpc.aio.insecure_channel(transformer.grpc)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()

    async def call(self, path: str, prompt: str, key: str | None, rid: str) -> Served:
        """One request through the transformer, carrying `rid` as its request id."""
        headers = {"x-request-id": rid}
        if key:
            headers["authorization"] = f"Bearer {key}"
        if path == "v2-rest":
            body = {"id": rid,
                    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                    "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
            r = await self.http.post(f"{self.t.http}/v2/models/{MODEL}/infer", json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            outs = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
            return Served(str(outs["cache_status"]), str(outs["text_output"]), outs.get("finish_reason"),
                          outs.get("completion_tokens"))
        if path == "v2-grpc":
            import grpc

            pb = self.pb
            req = pb.ModelInferRequest(
                model_name=MODEL, id=rid,
                inputs=[pb.ModelInferRequest.InferInputTensor(
                    name="text_input", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[prompt.encode()]))],
                parameters={"max_tokens": pb.InferParameter(int64_param=MAX_TOKENS),
                            "temperature": pb.InferParameter(int64_param=0)},
            )
            try:
                resp = await self.stub.ModelInfer(req, metadata=tuple(headers.items()),
                                                  timeout=REQUEST_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                raise Failure(f"grpc_{e.code().name}", str(e.details())[:200]) from e
            text = _grpc_output(resp, "text_output")
            if text is None:
                raise Failure("bad_response", "no text_output")
            finish = _grpc_output(resp, "finish_reason")
            tokens = _grpc_output(resp, "completion_tokens")
            return Served((_grpc_output(resp, "cache_status") or b"?").decode(), text.decode(),
                          finish.decode() if finish is not None else None,
                          struct.unpack("<i", tokens)[0] if tokens is not None else None)
        chat = path.startswith("openai-chat")
        stream = path.endswith("-stream")
        body: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        url = f"{self.t.http}/openai/v1/{'chat/completions' if chat else 'completions'}"
        if not stream:
            r = await self.http.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            return Served(r.headers.get("x-semserve-cache", "?"), str(text or ""),
                          choice.get("finish_reason"), (data.get("usage") or {}).get("completion_tokens"))
        parts: list[str] = []
        done = False
        finish: str | None = None
        tokens: int | None = None
        async with self.http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", (await r.aread()).decode(errors="replace")[:200])
            status = r.headers.get("x-semserve-cache", "?")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise Failure("stream_error", data[:200])
                if event.get("usage"):
                    tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices", []):
                    piece = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if piece:
                        parts.append(piece)
                    finish = choice.get("finish_reason") or finish
        if not done:
            raise Failure("stream_truncated", "no [DONE]")
        if finish is None:
            raise Failure("stream_truncated", "no chunk carried a finish_reason")
        return Served(status, "".join(parts), finish, tokens)
