"""Wire messages of semserve/v2/grpc_tensors.py: responses carry raw_output_contents as Triton sends
them, and a reader of our responses gets back exactly what the model answered."""

from __future__ import annotations

import struct

import pytest
from kserve import InferOutput, InferResponse
from kserve.errors import InvalidInput

from semserve.v2 import grpc_tensors as tensors
from semserve.v2 import inference_pb2 as pb


def test_bytes_tensor_wire_format_is_length_prefixed() -> None:
    raw = tensors.serialize_bytes(["hé", b"", "x"])
    assert raw == struct.pack("<I", 3) + "hé".encode() + struct.pack("<I", 0) + struct.pack("<I", 1) + b"x"
    assert tensors.deserialize_bytes(raw) == ["hé".encode(), b"", b"x"]


@pytest.mark.parametrize("raw", [b"\x05\x00\x00\x00ab", b"\x01\x00"])
def test_truncated_bytes_tensor_is_invalid_input(raw: bytes) -> None:
    with pytest.raises(InvalidInput):
        tensors.deserialize_bytes(raw)


def test_response_outputs_travel_raw_and_parameters_keep_their_type() -> None:
    response = InferResponse(
        response_id="r1",
        model_name="llm",
        infer_outputs=[
            InferOutput("text_output", [2], "BYTES", ["a", "bé"]),
            InferOutput("completion_tokens", [2], "INT32", [3, 70000]),
        ],
        parameters={"prompt_tokens": 7, "cache_similarity": 0.93, "model_revision": "v1", "ok": True},
    )
    wire = tensors.to_wire_response(response)
    assert len(wire.raw_output_contents) == 2
    assert all(not o.HasField("contents") for o in wire.outputs)
    again = pb.ModelInferResponse.FromString(wire.SerializeToString())
    assert tensors.output_columns(again) == {
        "text_output": [b"a", "bé".encode()], "completion_tokens": [3, 70000]
    }
    assert tensors.plain_parameters(again.parameters) == {
        "prompt_tokens": 7, "cache_similarity": 0.93, "model_revision": "v1", "ok": True
    }
    assert again.parameters["cache_similarity"].WhichOneof("parameter_choice") == "double_param"


def test_typed_contents_are_read_too() -> None:
    message = pb.ModelInferResponse(outputs=[
        pb.ModelInferResponse.InferOutputTensor(
            name="completion_tokens", datatype="INT32", shape=[1],
            contents=pb.InferTensorContents(int_contents=[4]),
        )
    ])
    assert tensors.output_columns(message) == {"completion_tokens": [4]}


def test_double_request_parameters_reach_the_request() -> None:
    message = pb.ModelInferRequest(model_name="llm", id="x")
    message.parameters["temperature"].double_param = 0.25
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    request = tensors.to_infer_request(message)
    assert tensors.plain_parameters(request.parameters) == {"temperature": 0.25}
    assert request.inputs[0].as_numpy().tolist() == [b"hi"]
