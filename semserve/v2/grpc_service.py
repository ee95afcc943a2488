"""`inference.GRPCInferenceService` as Triton serves it: KServe's servicer for health, metadata and
repository RPCs, and ours for `ModelInfer` (outputs in raw_output_contents, double parameters) and
the bidirectional `ModelStreamInfer` that KServe's proto lacks.

ModelStreamInfer follows Triton's decoupled-model conventions, which tritonclient's
`start_stream`/`async_stream_infer` and Triton's vLLM backend clients expect: requests on one stream
run concurrently; each gets one response (or, with the `stream` input, one per new text piece); every
response carries the request's `id` and the bool parameter `triton_final_response`, true on the last
one (or on an extra empty response when the request sets `triton_enable_empty_final_response`); a
request that fails gets an `error_message` response and the stream goes on. A client that cancels the
stream (or whose deadline passes) cancels every generation on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import grpc
from grpc import aio
from grpc_interceptor.exceptions import GrpcException
from kserve import InferRequest
from kserve.errors import ModelNotFound
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2 as kserve_pb
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.utils.utils import to_headers

from semserve import v2
from semserve.errors import SERVER_ERROR, ServingError, codes_of, error_field, error_text
from semserve.logs import get_logger
from semserve.v2 import grpc_tensors as tensors
from semserve.v2 import inference_pb2 as pb
from semserve.v2.requested_outputs import keep_outputs, requested_outputs
from semserve.v2.triton_routes import TritonModel, find, index

log = get_logger("semserve.v2")

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER = f"/{SERVICE}/ModelInfer"
MODEL_STREAM_INFER = f"/{SERVICE}/ModelStreamInfer"
# Ours beside Triton's `error_message`, so that a caller (our transformer) can tell a client error
# from an outage and name the field: parameters of an error response's infer_response...
ERROR_STATUS = "semserve_error_status"  # int: the HTTP status of the error (400, 404, 503, ...)
ERROR_FIELD = "semserve_error_field"  # string: the request field that was wrong
# ...and the trailing metadata key of a unary INVALID_ARGUMENT that names the field.
ERROR_FIELD_METADATA = "semserve-error-field"
# KServe's servicer answers these with its own messages (wire-compatible with Triton's).
_KSERVE_RPCS = (
    "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
    "RepositoryModelLoad", "RepositoryModelUnload",
)


@runtime_checkable
class StreamingModel(Protocol):
    """A model that answers a v2 request as a series of responses, the last marked final."""

    name: str

    async def output_names(self) -> list[str]: ...

    def infer_stream(
        self, request: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]: ...


class InferenceService:
    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    async def model_infer(self, message: pb.ModelInferRequest, context: aio.ServicerContext) -> Any:
        try:
            request = tensors.to_infer_request(message)
            response, _ = await self.dataplane.infer(
                model_name=message.model_name, request=request, headers=to_headers(context)
            )
        except Exception as exc:
            codes = codes_of(exc)
            if codes is SERVER_ERROR:
                raise  # KServe's interceptor logs it and answers INTERNAL
            # The error table's code and text; the field that was wrong travels beside them.
            event = "request_not_ready" if codes.http_status == 503 else "request_rejected"
            (log.info if codes.http_status == 503 else log.warning)(
                event, rpc="ModelInfer", status=codes.http_status, error=type(exc).__name__,
                detail=error_text(exc)[:200],
            )
            field = error_field(exc)
            if field:
                context.set_trailing_metadata(((ERROR_FIELD_METADATA, field),))
            raise GrpcException(error_text(exc), codes.grpc_status()) from None  # type: ignore[arg-type]
        return tensors.to_wire_response(response)

    async def model_config(self, message: pb.ModelConfigRequest, context: aio.ServicerContext) -> Any:
        model = self._triton_model(message.name, message.version)
        return pb.ModelConfigResponse(config=(await model.config()).proto())

    async def model_statistics(self, message: pb.ModelStatisticsRequest, context: aio.ServicerContext) -> Any:
        # Every model for an empty name, as Triton answers it.
        models = [self._triton_model(message.name, message.version)] if message.name else self._models()
        return pb.ModelStatisticsResponse(model_stats=[m.statistics.proto(m.name) for m in models])

    async def repository_index(self, message: pb.RepositoryIndexRequest, context: aio.ServicerContext) -> Any:
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in index(self._models(), message.ready)
        ])  # fmt: skip

    def _models(self) -> list[TritonModel]:
        return [m for m in self.dataplane.model_registry.get_models().values() if isinstance(m, TritonModel)]

    def _triton_model(self, name: str, version: str) -> TritonModel:
        try:
            return find(self._models(), name, version)
        except ServingError as exc:
            raise GrpcException(error_text(exc), codes_of(exc).grpc_status()) from None  # type: ignore[arg-type]

    async def model_stream_infer(
        self, messages: AsyncIterator[pb.ModelInferRequest], context: aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        headers = to_headers(context)
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def read() -> None:
            try:
                async for message in messages:
                    task = asyncio.ensure_future(self._answer(message, headers, out))
                    running.add(task)
                    task.add_done_callback(running.discard)
                # The client is done sending: the stream ends once its requests are answered.
                while running:
                    await asyncio.gather(*list(running), return_exceptions=True)
            finally:
                await out.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await out.get()) is not None:
                yield item
            reader.result()  # a broken request stream is the RPC's error
        finally:
            # Cancelled by the client, its deadline or a shutdown: every generation stops with it.
            reader.cancel()
            for task in list(running):
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(reader, *running, return_exceptions=True)

    async def _answer(
        self, message: pb.ModelInferRequest, headers: dict[str, str], out: asyncio.Queue[Any]
    ) -> None:
        params = tensors.plain_parameters(message.parameters)
        empty_final = params.get(v2.EMPTY_FINAL_RESPONSE) is True
        try:
            model = self.dataplane.get_model_from_registry(message.model_name)
            if not isinstance(model, StreamingModel):
                raise ModelNotFound(message.model_name)
            request = tensors.to_infer_request(message)
            names = requested_outputs(request, await model.output_names())
            finished = False
            # Read to the end, not up to the final part: breaking out would close the model's
            # generator in its last step (vLLM counts that as an aborted request).
            async for part in model.infer_stream(request, headers):
                if finished:
                    continue
                finished = part.final
                wire = tensors.to_wire_response(keep_outputs(part.response, names))
                await out.put(self._response(message, wire, final=part.final and not empty_final))
            if empty_final or not finished:
                await out.put(self._response(message, pb.ModelInferResponse(), final=True))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if codes_of(exc) is SERVER_ERROR:
                log.exception("stream_request_failed", model=message.model_name)
            failed = pb.ModelInferResponse(model_name=message.model_name, id=message.id)
            status = codes_of(exc).http_status
            failed.parameters[ERROR_STATUS].CopyFrom(pb.InferParameter(int64_param=status))
            if error_field(exc):
                failed.parameters[ERROR_FIELD].CopyFrom(pb.InferParameter(string_param=error_field(exc)))
            await out.put(pb.ModelStreamInferResponse(error_message=error_text(exc), infer_response=failed))

    @staticmethod
    def _response(
        message: pb.ModelInferRequest, response: pb.ModelInferResponse, *, final: bool
    ) -> pb.ModelStreamInferResponse:
        response.model_name = response.model_name or message.model_name
        response.id = message.id
        response.parameters[v2.FINAL_RESPONSE].CopyFrom(pb.InferParameter(bool_param=final))
        return pb.ModelStreamInferResponse(infer_response=response)


def generic_handler(dataplane: DataPlane, kserve_servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """Every RPC of the service, for `server.add_generic_rpc_handlers`."""
    ours = InferenceService(dataplane)
    handlers: dict[str, grpc.RpcMethodHandler] = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(kserve_servicer, name),
            request_deserializer=getattr(kserve_pb, f"{name}Request").FromString,
            response_serializer=getattr(kserve_pb, f"{name}Response").SerializeToString,
        )
        for name in _KSERVE_RPCS
    }
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        ours.model_infer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    for name, method in (("ModelConfig", ours.model_config), ("ModelStatistics", ours.model_statistics),
                         ("RepositoryIndex", ours.repository_index)):
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            method,
            request_deserializer=getattr(pb, f"{name}Request").FromString,
            response_serializer=getattr(pb, f"{name}Response").SerializeToString,
        )
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        ours.model_stream_infer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
