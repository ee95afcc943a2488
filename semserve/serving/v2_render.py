"""The bytes of a v2 REST infer answer, as KServe's route writes them.

KServe's route turns the model's InferResponse into a dict (`to_rest`: every output through numpy
and back), validates it into its pydantic InferenceResponse, and FastAPI writes that with
`jsonable_encoder` and ORJSONResponse. For the answers text models give (BYTES outputs of str,
INT32 outputs of int, flat; scalar parameters) every one of those steps hands its values on
unchanged, so `plain_content` builds the final content directly, fields in the model's order;
anything else takes KServe's steps (`render`).
"""

from __future__ import annotations

from typing import Any

import orjson
from kserve import InferResponse
from kserve.protocol.rest.v2_datamodels import InferenceResponse

# FastAPI's default response class in KServe's app is ORJSONResponse; these are its options.
ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
# jsonable_encoder drops dict keys starting with this (SQLAlchemy state).
_SQLALCHEMY_PREFIX = "_sa"
_INT32 = (-(2**31), 2**31 - 1)
# What pydantic's Union[StrictFloat, StrictInt, StrictBool, str] keeps as it is.
_PARAMETER_TYPES = (str, int, float, bool)


def render(response: InferenceResponse) -> bytes:
    """What FastAPI writes for a returned InferenceResponse (response_model None)."""
    if _plain_keys(response.parameters) and all(_plain_keys(o.parameters) for o in response.outputs):
        content: Any = response.model_dump(mode="json", by_alias=True)
    else:
        from fastapi.encoders import jsonable_encoder

        content = jsonable_encoder(response)
    return orjson.dumps(content, option=ORJSON_OPTIONS)


def plain_content(response: Any) -> dict[str, Any] | None:
    """The JSON content of `response` as KServe's route would write it, when building it directly
    gives the same; else None (then `render` after KServe's own encoding)."""
    if not isinstance(response, InferResponse) or response._requested_outputs:
        return None
    if response._use_binary_outputs or not _plain_strings(response.model_name, response.id):
        return None
    if response.model_version is not None and type(response.model_version) is not str:
        return None
    params = response.parameters
    if params and not _plain_parameters(params):
        return None
    outputs = []
    for output in response.outputs:
        data = output.data
        if output._raw_data is not None or output.parameters or type(data) is not list:
            return None
        if list(output.shape) != [len(data)] or not _plain_values(output.datatype, data):
            return None
        outputs.append({
            "name": output.name, "shape": [len(data)], "datatype": output.datatype,
            "parameters": None, "data": data,
        })
    if not _plain_strings(*(o["name"] for o in outputs)):
        return None
    return {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "parameters": dict(params) if params else None,
        "outputs": outputs,
    }


def dumps(content: dict[str, Any]) -> bytes:
    return orjson.dumps(content, option=ORJSON_OPTIONS)


def _plain_strings(*values: Any) -> bool:
    return all(type(v) is str for v in values)


def _plain_values(datatype: str, data: list[Any]) -> bool:
    if datatype == "BYTES":
        return all(type(v) is str for v in data)
    if datatype == "INT32":
        low, high = _INT32
        return all(type(v) is int and low <= v <= high for v in data)
    return False


def _plain_parameters(params: Any) -> bool:
    if type(params) is not dict:
        return False
    return all(
        type(k) is str and not k.startswith(_SQLALCHEMY_PREFIX) and type(v) in _PARAMETER_TYPES
        for k, v in params.items()
    )


def _plain_keys(params: dict[str, Any] | None) -> bool:
    return not params or not any(str(k).startswith(_SQLALCHEMY_PREFIX) for k in params)
