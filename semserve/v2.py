"""The v2 (Open Inference Protocol) tensor contract for text generation, shared by both services.

It is the contract of Triton's vLLM backend, so existing clients work unchanged:
- input  `text_input` BYTES [B] (or [B, 1]): B prompts, generated together;
- input  `sampling_parameters` BYTES [1] (optional): a JSON object, merged over request parameters;
- output `text_output` BYTES [B], `finish_reason` BYTES [B], `completion_tokens` INT32 [B].
Sampling comes from request `parameters` (`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`,
`stop`, `ignore_eos`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse

from semserve.errors import BadRequest
from semserve.sampling import SamplingOptions, parse_sampling

TEXT_INPUT = "text_input"
SAMPLING_INPUT = "sampling_parameters"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
COMPLETION_TOKENS = "completion_tokens"
# Response parameter (string): the model revision that produced the answer, when the predictor has
# one (--model-revision); the transformer does not cache answers of another revision than its own.
MODEL_REVISION = "model_revision"

INPUTS_METADATA: list[dict[str, Any]] = [
    {"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]},
    # Optional (the gRPC TensorMetadata message has no field to say so).
    {"name": SAMPLING_INPUT, "datatype": "BYTES", "shape": [1]},
]
OUTPUTS_METADATA: list[dict[str, Any]] = [
    {"name": TEXT_OUTPUT, "datatype": "BYTES", "shape": [-1]},
    {"name": FINISH_REASON, "datatype": "BYTES", "shape": [-1]},
    {"name": COMPLETION_TOKENS, "datatype": "INT32", "shape": [-1]},
]


@dataclass(frozen=True)
class TextRequest:
    prompts: list[str]
    sampling: SamplingOptions
    # Request-level parameters other than sampling (e.g. the transformer's cache hints), kept verbatim.
    extra: dict[str, Any]


@dataclass(frozen=True)
class TextResult:
    text: str
    finish_reason: str
    completion_tokens: int
    prompt_tokens: int = 0


def _plain_parameters(params: Any) -> dict[str, Any]:
    """Request parameters as plain Python values, whether they came over REST or gRPC."""
    if not params:
        return {}
    if hasattr(params, "items"):  # a dict over REST, a protobuf map over gRPC
        return {str(key): _param_value(value) for key, value in params.items()}
    raise BadRequest("parameters must be an object", "parameters")


def _param_value(value: Any) -> Any:
    # gRPC InferParameter messages carry one of bool/int64/string/double.
    if hasattr(value, "WhichOneof"):
        kind = value.WhichOneof("parameter_choice")
        return getattr(value, kind) if kind else None
    return value


def _decode(item: Any, index: int) -> str:
    if isinstance(item, bytes):
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"{TEXT_INPUT}[{index}] is not valid UTF-8", TEXT_INPUT) from None
    elif isinstance(item, str):
        text = item
        # JSON may carry a lone surrogate ("\ud800"): a Python str, but not text any tokenizer
        # can take (vLLM raised TypeError, a 500).
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{TEXT_INPUT}[{index}] is not valid UTF-8", TEXT_INPUT) from None
    else:
        raise BadRequest(f"{TEXT_INPUT}[{index}] must be a string", TEXT_INPUT)
    if "\x00" in text:
        raise BadRequest(f"{TEXT_INPUT}[{index}] contains a NUL character", TEXT_INPUT)
    if not text.strip():
        raise BadRequest(f"{TEXT_INPUT}[{index}] is empty", TEXT_INPUT)
    return text


def _elements(inp: Any) -> list[Any]:
    if inp.datatype != "BYTES":
        raise BadRequest(f"{inp.name} must have datatype BYTES, got {inp.datatype}", inp.name)
    shape = list(inp.shape)
    if not 1 <= len(shape) <= 2 or (len(shape) == 2 and shape[1] != 1):
        raise BadRequest(f"{inp.name} must have shape [B] or [B, 1], got {shape}", inp.name)
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise BadRequest(f"{inp.name} has an invalid shape {shape}", inp.name)
    try:
        array = inp.as_numpy()
    except Exception as exc:  # numpy raises several types for data that doesn't fit the shape
        raise BadRequest(f"{inp.name}: data does not match shape {shape}: {exc}", inp.name) from None
    return list(np.asarray(array, dtype=object).reshape(-1))


def parse_request(request: InferRequest, max_batch: int) -> TextRequest:
    names = [i.name for i in request.inputs]
    unknown = [n for n in names if n not in (TEXT_INPUT, SAMPLING_INPUT)]
    if unknown:
        raise BadRequest(f"unknown input(s) {unknown}; expected {TEXT_INPUT!r}", unknown[0])
    text_input = request.get_input_by_name(TEXT_INPUT)
    if text_input is None:
        raise BadRequest(f"missing input {TEXT_INPUT!r} (BYTES, shape [B])", TEXT_INPUT)
    items = _elements(text_input)
    if not items:
        raise BadRequest(f"{TEXT_INPUT} holds no prompts", TEXT_INPUT)
    if len(items) > max_batch:
        raise BadRequest(f"{TEXT_INPUT} holds {len(items)} prompts; at most {max_batch}", TEXT_INPUT)
    prompts = [_decode(item, i) for i, item in enumerate(items)]

    params = _plain_parameters(request.parameters)
    sampling_input = request.get_input_by_name(SAMPLING_INPUT)
    if sampling_input is not None:
        raw = _elements(sampling_input)
        if len(raw) != 1:
            raise BadRequest(f"{SAMPLING_INPUT} must hold exactly one JSON object", SAMPLING_INPUT)
        text = raw[0].decode("utf-8", "replace") if isinstance(raw[0], bytes) else str(raw[0])
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"{SAMPLING_INPUT} is not valid JSON: {exc.msg}", SAMPLING_INPUT) from None
        if not isinstance(parsed, dict):
            raise BadRequest(f"{SAMPLING_INPUT} must be a JSON object", SAMPLING_INPUT)
        params = {**params, **parsed}
    # `stop` may arrive as a JSON-encoded list in a string parameter (v2 parameters are scalars).
    stop = params.get("stop")
    if isinstance(stop, str) and stop.startswith("["):
        try:
            params["stop"] = json.loads(stop)
        except json.JSONDecodeError:
            raise BadRequest("stop is not a valid JSON list", "stop") from None
    sampling = parse_sampling(params)
    extra = {k: v for k, v in params.items() if k not in sampling.to_dict()}
    return TextRequest(prompts=prompts, sampling=sampling, extra=extra)


def build_response(
    model_name: str,
    request_id: str | None,
    results: list[TextResult],
    parameters: dict[str, Any] | None = None,
    extra_outputs: dict[str, list[str]] | None = None,
) -> InferResponse:
    batch = len(results)
    outputs = [
        InferOutput(TEXT_OUTPUT, [batch], "BYTES", [r.text for r in results]),
        InferOutput(FINISH_REASON, [batch], "BYTES", [r.finish_reason for r in results]),
        InferOutput(COMPLETION_TOKENS, [batch], "INT32", [int(r.completion_tokens) for r in results]),
    ]
    for name, values in (extra_outputs or {}).items():
        outputs.append(InferOutput(name, [len(values)], "BYTES", list(values)))
    return InferResponse(
        response_id=request_id or "",
        model_name=model_name,
        infer_outputs=outputs,
        parameters=parameters,
    )


def read_response(response: InferResponse) -> list[TextResult]:
    """The inverse of build_response, for the transformer reading the predictor's answer."""

    def column(name: str) -> list[Any]:
        out = response.get_output_by_name(name)
        if out is None:
            raise BadRequest(f"predictor response lacks output {name!r}", name)
        return list(np.asarray(out.as_numpy(), dtype=object).reshape(-1))

    def text(v: Any) -> str:
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    texts = column(TEXT_OUTPUT)
    reasons = column(FINISH_REASON)
    tokens = column(COMPLETION_TOKENS)
    return [
        TextResult(text(t), text(r), int(n)) for t, r, n in zip(texts, reasons, tokens, strict=True)
    ]


def response_revision(response: InferResponse) -> str | None:
    """The `model_revision` response parameter (REST dict or gRPC map), or None when absent."""
    params = response.parameters
    if not params or not hasattr(params, "items"):
        return None
    value = next((_param_value(v) for k, v in params.items() if k == MODEL_REVISION), None)
    return str(value) if value not in (None, "") else None
