"""gRPC server reflection (grpcurl, grpcui, Postman) describing the service as it is served: KServe's
proto for the RPCs its servicer answers, with our messages where ours differ (InferParameter's
double and uint64 params, the infer messages) and Triton's ModelStreamInfer, ModelConfig,
ModelStatistics and RepositoryIndex, which KServe's proto lacks. The descriptor lives in a pool of
its own: its names (`inference.*`) are KServe's too, and both cannot share the default pool."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from kserve.protocol.grpc import grpc_predict_v2_pb2 as kserve_pb

from semserve.v2 import inference_pb2 as pb
from semserve.v2.grpc_service import SERVICE

_OURS, _SERVED = f".{pb.DESCRIPTOR.package}.", f".{kserve_pb.DESCRIPTOR.package}."


def service_file() -> descriptor_pb2.FileDescriptorProto:
    """The served service's file: KServe's, our messages in place of its own, ModelStreamInfer and
    Triton's ModelConfig, ModelStatistics and RepositoryIndex added."""
    served = descriptor_pb2.FileDescriptorProto()
    kserve_pb.DESCRIPTOR.CopyToProto(served)
    ours = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(ours)
    replacing = {message.name: message for message in ours.message_type}
    messages = [replacing.pop(m.name, m) for m in served.message_type] + list(replacing.values())
    for message in messages:
        _retype(message)
    del served.message_type[:]
    served.message_type.extend(messages)
    served.enum_type.extend(ours.enum_type)
    [service] = served.service
    service.method.add(
        name="ModelStreamInfer",
        input_type=f"{_SERVED}ModelInferRequest",
        output_type=f"{_SERVED}ModelStreamInferResponse",
        client_streaming=True,
        server_streaming=True,
    )
    for name in ("ModelConfig", "ModelStatistics", "RepositoryIndex"):  # Triton's extensions
        service.method.add(name=name, input_type=f"{_SERVED}{name}Request",
                           output_type=f"{_SERVED}{name}Response")
    served.name = "semserve/grpc_inference_service.proto"
    return served


def _retype(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type_name.startswith(_OURS):
            field.type_name = _SERVED + field.type_name.removeprefix(_OURS)
    for nested in message.nested_type:
        _retype(nested)


def add_reflection(server: aio.Server) -> None:
    pool = descriptor_pool.DescriptorPool()
    for module in (health_pb2, reflection_pb2):
        file = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file)
        pool.Add(file)
    pool.Add(service_file())
    names = (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server, pool=pool)
