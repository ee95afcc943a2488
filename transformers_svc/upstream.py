"""Calls to the predictor: v2 over gRPC (or REST) for v2 traffic, OpenAI over HTTP for OpenAI traffic
(streaming needs it: v2 gRPC has no stream RPC). Every failure becomes a ServingError: the
predictor's own 4xx pass through with its message; unreachable, slow or failing becomes 503.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from kserve import InferResponse
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from semserve import tracing, v2
from semserve.errors import BadRequest, NotFound, ServingError, Unavailable
from semserve.logs import get_logger
from semserve.openai_routes import MODEL_REVISION_HEADER
from semserve.sampling import SamplingOptions
from transformers_svc import metrics
from transformers_svc.config import TransformerSettings

log = get_logger("semserve.transformer.upstream")


def _sampling_json(options: SamplingOptions) -> str:
    # KServe's v2 proto carries only bool/int/string parameters; the JSON input carries floats.
    d = options.to_dict()
    return json.dumps({k: v for k, v in d.items() if v is not None})


@dataclass
class StreamInfo:
    """What the predictor's stream response said before its first chunk."""

    # The model revision that produces the stream (header x-semserve-model-revision); None: not said.
    model_revision: str | None = None


def _revision_header(headers: httpx.Headers) -> str | None:
    return headers.get(MODEL_REVISION_HEADER) or None


class PredictorClient:
    def __init__(self, settings: TransformerSettings) -> None:
        self.settings = settings
        self.model = settings.model_name
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.GRPCInferenceServiceStub | None = None
        self.http = httpx.AsyncClient(
            base_url=settings.predictor_url or "http://predictor-url-not-set.invalid",
            timeout=httpx.Timeout(settings.predictor_timeout_s, connect=settings.predictor_connect_timeout_s),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    def _grpc_stub(self) -> pb_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                self.settings.predictor_host,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.max_send_message_length", 64 * 1024 * 1024),
                    # Reconnect quickly after a predictor restart instead of backing off for ~minutes.
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.min_reconnect_backoff_ms", 500),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ],
            )
            self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        await self.http.aclose()
        if self._channel is not None:
            await self._channel.close()

    # -- v2 -------------------------------------------------------------------------------------

    async def generate_v2(
        self, prompts: list[str], options: SamplingOptions, request_id: str
    ) -> tuple[list[v2.TextResult], str | None]:
        """The predictor's results and the model revision it reports (None: it reports none)."""
        protocol = self.settings.predictor_protocol
        try:
            if protocol == "grpc-v2":
                results = await self._grpc_infer(prompts, options, request_id)
            else:
                results = await self._rest_infer(prompts, options, request_id)
        except ServingError as exc:
            metrics.PREDICTOR_CALLS.labels(self.model, protocol, type(exc).__name__).inc()
            raise
        metrics.PREDICTOR_CALLS.labels(self.model, protocol, "ok").inc()
        return results

    async def _grpc_infer(
        self, prompts: list[str], options: SamplingOptions, request_id: str
    ) -> tuple[list[v2.TextResult], str | None]:
        stub = self._grpc_stub()
        request = pb.ModelInferRequest(
            model_name=self.model,
            id=request_id,
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name=v2.TEXT_INPUT, datatype="BYTES", shape=[len(prompts)],
                    contents=pb.InferTensorContents(bytes_contents=[p.encode() for p in prompts]),
                ),
                pb.ModelInferRequest.InferInputTensor(
                    name=v2.SAMPLING_INPUT, datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[_sampling_json(options).encode()]),
                ),
            ],
        )
        host, _, port = self.settings.predictor_host.rpartition(":")
        with tracing.span(
            "inference.GRPCInferenceService/ModelInfer", tracing.SpanKind.CLIENT,
            rpc__system="grpc", rpc__service="inference.GRPCInferenceService", rpc__method="ModelInfer",
            server__address=host or None, server__port=int(port) if port.isdigit() else None,
            gen_ai__request__model=self.model, semserve__prompts=len(prompts),
        ) as span:
            # traceparent rides in the metadata: the predictor's span continues this trace.
            rid = _wire_id(request_id)
            metadata = tracing.grpc_metadata((("x-request-id", rid),) if rid else ())
            try:
                response = await stub.ModelInfer(
                    request, timeout=self.settings.predictor_timeout_s, metadata=metadata or None
                )
            except grpc.aio.AioRpcError as err:
                span.set_attribute("rpc.grpc.status_code", err.code().value[0])
                raise _from_grpc(err) from None
            span.set_attribute("rpc.grpc.status_code", 0)
        infer = InferResponse.from_grpc(response)
        return v2.read_response(infer), v2.response_revision(infer)

    async def _rest_infer(
        self, prompts: list[str], options: SamplingOptions, request_id: str
    ) -> tuple[list[v2.TextResult], str | None]:
        host = self.settings.predictor_host
        base = host if host.startswith("http") else f"http://{host}"
        body = {
            "id": request_id,
            "inputs": [
                {"name": v2.TEXT_INPUT, "datatype": "BYTES", "shape": [len(prompts)], "data": prompts},
                {"name": v2.SAMPLING_INPUT, "datatype": "BYTES", "shape": [1],
                 "data": [_sampling_json(options)]},
            ],
        }
        data, _ = await self._post(f"{base}/v2/models/{self.model}/infer", body, request_id)
        infer = InferResponse.from_rest(data)
        return v2.read_response(infer), v2.response_revision(infer)

    # -- OpenAI ---------------------------------------------------------------------------------

    async def _post(
        self, url: str, body: dict[str, Any], request_id: str
    ) -> tuple[dict[str, Any], httpx.Headers]:
        with tracing.span("POST", tracing.SpanKind.CLIENT, **self._http_attributes(url)) as span:
            try:
                resp = await self.http.post(url, json=body, headers=tracing.inject(_headers(request_id)))
            except httpx.HTTPError as exc:
                span.set_attribute("error.type", type(exc).__name__)
                raise Unavailable(f"predictor unavailable: {type(exc).__name__}: {exc}") from None
            span.set_attribute("http.response.status_code", resp.status_code)
            if resp.status_code != 200:
                raise _from_http(resp.status_code, resp.content)
            return resp.json(), resp.headers

    def _http_attributes(self, url: str) -> dict[str, Any]:
        if not tracing.recording():
            return {}  # untraced requests do not pay for building the URL
        full = self.http.build_request("POST", url).url
        return {
            "http__request__method": "POST",
            "url__full": str(full),
            "server__address": full.host,
            "server__port": full.port or (443 if full.scheme == "https" else 80),
            "gen_ai__request__model": self.model,
        }

    def _check_http(self) -> None:
        if not self.settings.predictor_url:
            # Knative routes one port per container and the predictor's is gRPC (h2c); OpenAI
            # misses need its HTTP port, which only Standard mode (or a --predictor-url) provides.
            raise Unavailable(
                "OpenAI cache misses need the predictor's HTTP port: set --predictor-url "
                "(KServe Standard mode exposes it); v2 requests work over gRPC"
            )

    async def openai_json(
        self, path: str, body: dict[str, Any], request_id: str
    ) -> tuple[dict[str, Any], str | None]:
        """The predictor's OpenAI answer and the model revision it reports (None: none)."""
        self._check_http()
        try:
            data, headers = await self._post(path, body, request_id)
        except ServingError as exc:
            metrics.PREDICTOR_CALLS.labels(self.model, "openai", type(exc).__name__).inc()
            raise
        metrics.PREDICTOR_CALLS.labels(self.model, "openai", "ok").inc()
        return data, _revision_header(headers)

    async def openai_stream(
        self, path: str, body: dict[str, Any], request_id: str, info: StreamInfo | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Parsed SSE chunks from the predictor. Closing this generator closes the connection, and
        the predictor aborts the generation. `info` is filled from the response headers before the
        first chunk is yielded."""
        self._check_http()
        # An async generator runs in its consumer's context: the span is started, not made current,
        # and ended here whether the stream completes, fails or is closed early.
        span = tracing.start_child("POST", tracing.SpanKind.CLIENT, **self._http_attributes(path))
        headers = tracing.inject(_headers(request_id), tracing.context_of(span))
        chunks = 0
        try:
            async with self.http.stream("POST", path, json=body, headers=headers) as resp:
                span.set_attribute("http.response.status_code", resp.status_code)
                if resp.status_code != 200:
                    raise _from_http(resp.status_code, await resp.aread())
                metrics.PREDICTOR_CALLS.labels(self.model, "openai-stream", "ok").inc()
                if info is not None:
                    info.model_revision = _revision_header(resp.headers)
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise Unavailable(f"predictor failed mid-stream: {chunk['error']}")
                    chunks += 1
                    yield chunk
            raise Unavailable("predictor stream ended without [DONE]")
        except httpx.HTTPError as exc:
            metrics.PREDICTOR_CALLS.labels(self.model, "openai-stream", "Unavailable").inc()
            tracing.fail(span, exc)
            raise Unavailable(f"predictor unavailable: {type(exc).__name__}: {exc}") from None
        except ServingError as exc:
            tracing.fail(span, exc)
            raise
        finally:
            span.set_attribute("semserve.stream.chunks", chunks)
            span.end()


def _wire_id(request_id: str) -> str:
    """The request id as a header/metadata value may carry it: a v2 body's `id` can hold any text,
    and a control character there would fail the whole upstream call."""
    return "".join(c for c in request_id if " " <= c <= "~")[:256]


def _headers(request_id: str) -> dict[str, str]:
    rid = _wire_id(request_id)
    return {"x-request-id": rid} if rid else {}


def _from_grpc(err: grpc.aio.AioRpcError) -> ServingError:
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadRequest(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(details)
    log.warning("predictor_grpc_error", code=code.name, details=details[:200])
    return Unavailable(f"predictor unavailable ({code.name}): {details[:200]}")


def _from_http(status: int, content: bytes) -> ServingError:
    try:
        body = json.loads(content)
        err = body.get("error")
        message = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = content[:200].decode("utf-8", "replace")
    if status in (400, 413, 422):
        return BadRequest(message or "rejected by the predictor")
    if status == 404:
        return NotFound(message or "not found at the predictor")
    log.warning("predictor_http_error", status=status, message=(message or "")[:200])
    return Unavailable(f"predictor answered {status}: {message}"[:300])
