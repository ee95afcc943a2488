"""Between the wire messages of semserve/v2/inference.proto and KServe's InferRequest/InferResponse.

Responses always carry their outputs in `raw_output_contents`, as Triton sends them: tritonclient
with numpy 2 reads nothing else (typed `contents` fail in `InferResult.as_numpy`). Requests are read
in either form, since clients send both.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput
from kserve.protocol.grpc.servicer import InferenceServicer

from semserve.errors import BadRequest
from semserve.v2 import inference_pb2 as pb

# Little-endian numpy types of the fixed-size v2 datatypes (BYTES is length-prefixed instead).
_NUMPY = {
    "BOOL": "?", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameter(value: Any) -> pb.InferParameter:
    # bool before int: a bool is an int to Python.
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    if isinstance(value, str):
        return pb.InferParameter(string_param=value)
    if hasattr(value, "WhichOneof"):  # already a wire parameter (KServe's or ours)
        return pb.InferParameter.FromString(value.SerializeToString())
    raise InvalidInput(f"parameter value of type {type(value).__name__} cannot be sent")


def parameter_value(value: Any) -> Any:
    """A wire parameter as a plain Python value (None when no field is set)."""
    if hasattr(value, "WhichOneof"):
        kind = value.WhichOneof("parameter_choice")
        return getattr(value, kind) if kind else None
    return value


def plain_parameters(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(k): parameter_value(v) for k, v in (params or {}).items()}


def serialize_bytes(items: list[Any]) -> bytes:
    out = bytearray()
    for item in items:
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        out += struct.pack("<I", len(data))
        out += data
    return bytes(out)


def deserialize_bytes(raw: bytes) -> list[bytes]:
    items: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidInput("BYTES tensor: truncated length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidInput("BYTES tensor: element runs past the end of the data")
        items.append(raw[offset:offset + length])
        offset += length
    return items


def raw_contents(datatype: str, data: Any) -> bytes:
    values = data.tolist() if isinstance(data, np.ndarray) else list(data)
    if datatype == "BYTES":
        return serialize_bytes(values)
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise InvalidInput(f"output datatype {datatype} cannot be sent")
    return np.asarray(values, dtype=dtype).tobytes()


def to_wire_response(response: InferResponse) -> pb.ModelInferResponse:
    """KServe's response as Triton sends it: every output's data in raw_output_contents."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version or "",
        id=response.id or "",
    )
    for key, value in (response.parameters or {}).items():
        message.parameters[key].CopyFrom(parameter(value))
    for output in response.outputs:
        tensor = message.outputs.add(name=output.name, datatype=output.datatype, shape=list(output.shape))
        for key, value in (output.parameters or {}).items():
            tensor.parameters[key].CopyFrom(parameter(value))
        data = output.data
        if data is None:  # set as binary data (e.g. FP16): its values through KServe's public reader
            data = np.asarray(output.as_numpy()).reshape(-1)
        message.raw_output_contents.append(raw_contents(output.datatype, data))
    return message


def to_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    if message.model_version:
        # As the REST route answers `/v2/models/{name}/versions/{v}/infer` (KServe's text): a pod
        # serves one version of its model, and the metadata names none.
        raise BadRequest("not supported by this server: Model versioning not supported yet.", "model_version")
    # KServe's own checks of raw vs typed inputs, then its conversion (it reads fields by name, so
    # our message type serves as well as its own).
    InferenceServicer.validate_grpc_request(message)  # type: ignore[arg-type]
    return InferRequest.from_grpc(message)  # type: ignore[arg-type]


def output_columns(message: pb.ModelInferResponse) -> dict[str, list[Any]]:
    """Each output's values as a flat list (BYTES as bytes), from raw or typed contents."""
    raw = list(message.raw_output_contents)
    if raw and len(raw) != len(message.outputs):
        raise InvalidInput("response has raw contents for some outputs only")
    columns: dict[str, list[Any]] = {}
    for i, output in enumerate(message.outputs):
        if raw:
            if output.datatype == "BYTES":
                columns[output.name] = deserialize_bytes(raw[i])
            else:
                dtype = _NUMPY.get(output.datatype)
                if dtype is None:
                    raise InvalidInput(f"output {output.name}: unknown datatype {output.datatype}")
                columns[output.name] = np.frombuffer(raw[i], dtype=dtype).tolist()
        else:
            field = _CONTENTS.get(output.datatype)
            if field is None:
                raise InvalidInput(f"output {output.name}: unknown datatype {output.datatype}")
            columns[output.name] = list(getattr(output.contents, field))
    return columns
