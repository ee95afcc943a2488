"""gRPC server reflection, read by grpc's own reflection client as grpcurl reads it: both services
list the inference, health and reflection services, describe the inference service as served
(ModelStreamInfer bidirectional, InferParameter with double_param) and a ModelInfer built from the
reflected descriptors alone gets its answer."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from semserve.v2.grpc_reflection import service_file
from tests.conftest import FRANCE, Predictor, Transformer


@pytest.fixture(params=["predictor", "transformer"])
def grpc_address(request: pytest.FixtureRequest) -> str:
    server: Predictor | Transformer = request.getfixturevalue(request.param)
    return server.grpc


def test_the_file_describes_every_rpc_served() -> None:
    [service] = service_file().service
    assert [m.name for m in service.method] == [
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
        "RepositoryModelLoad", "RepositoryModelUnload", "ModelStreamInfer", "ModelConfig", "ModelStatistics",
        "RepositoryIndex",
    ]  # fmt: skip


def test_reflection_describes_the_service_and_a_call_made_from_it_is_answered(grpc_address: str) -> None:
    with grpc.insecure_channel(grpc_address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == {"inference.GRPCInferenceService", "grpc.health.v1.Health",
                                                "grpc.reflection.v1alpha.ServerReflection"}  # fmt: skip
        pool = DescriptorPool(database)
        service = pool.FindServiceByName("inference.GRPCInferenceService")
        stream = service.methods_by_name["ModelStreamInfer"]
        assert stream.client_streaming and stream.server_streaming
        assert "double_param" in pool.FindMessageTypeByName("inference.InferParameter").fields_by_name
        infer = service.methods_by_name["ModelInfer"]
        request_type = message_factory.GetMessageClass(infer.input_type)
        response_type = message_factory.GetMessageClass(infer.output_type)
        request = json_format.ParseDict({
            "model_name": "llm",
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
            "parameters": {"max_tokens": {"int64_param": 8}, "temperature": {"double_param": 0.0}},
        }, request_type())
        request.inputs[0].contents.bytes_contents.append(FRANCE.encode())
        call = channel.unary_unary(f"/{service.full_name}/ModelInfer",
                                   request_serializer=request_type.SerializeToString,
                                   response_deserializer=response_type.FromString)  # fmt: skip
        response = call(request, timeout=120)
        assert response.outputs[0].name == "text_output"
        assert b"Paris" in response.raw_output_contents[0]
