"""The v2 (Open Inference Protocol) text tensor contract, shared by both services: the inputs and
outputs of a text model, parsed from a KServe InferRequest and built into an InferResponse.

It is the contract of Triton's vLLM backend, so existing clients work unchanged:
- input  `text_input` BYTES [B] (or [B, 1]): B prompts, generated together;
- or     `chat` BYTES [B]: B chat prompts, each the JSON of an OpenAI chat request's prompt-shaping
         fields {"messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
         "chat_template_kwargs"}, rendered with the model's chat template by the predictor
         (semserve.openai_protocol.ChatPrompt); a non-text response_format or a forced tool call
         is the request's structured-outputs constraint;
- input  `sampling_parameters` BYTES [1] (optional): a JSON object, merged over request parameters;
- input  `stream` BOOL [1] (optional, or parameter `stream`): on ModelStreamInfer and
         generate_stream, one response per new text piece instead of one per request;
- output `text_output` BYTES [B], `finish_reason` BYTES [B], `completion_tokens` INT32 [B].
Sampling comes from request `parameters` (`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`,
`stop`, `ignore_eos`). Response parameters: `prompt_tokens` (the batch's sum) and `model_revision`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse
from pydantic import ValidationError

from semserve.answer import Answer, Logprobs, TokenLogprob
from semserve.errors import BadRequest
from semserve.openai_protocol import ChatPrompt, CompletionPrompt, TokenPrompt, validation_error
from semserve.sampling import SamplingOptions, parse_sampling, structured_outputs

TEXT_INPUT = "text_input"
CHAT_INPUT = "chat"
# Instead of text_input: token ids, INT32 or INT64, shape [L] (one prompt) or [B, L] (B prompts
# of L tokens), read by the model as they are (vLLM's token prompts).
IDS_INPUT = "input_ids"
SAMPLING_INPUT = "sampling_parameters"
STREAM_INPUT = "stream"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
COMPLETION_TOKENS = "completion_tokens"
# Only with the `logprobs` parameter: per answer, the JSON list of its tokens' logprobs, each
# [token, logprob, [[alternative, logprob], ...]] (semserve.answer.TokenLogprob).
LOGPROBS_OUTPUT = "logprobs"
# Only with the `prompt_logprobs` parameter: per answer, the same list for its prompt's tokens, the
# first with a null logprob (nothing predicts it). On a stream, in the first response only.
PROMPT_LOGPROBS_OUTPUT = "prompt_logprobs"
# Only for token-id prompts: per prompt, the text its ids decode to (what completions' echo shows).
PROMPT_TEXT_OUTPUT = "prompt_text"
# Response parameter (string): the model revision that produced the answer, when the predictor has
# one (--model-revision); the transformer does not cache answers of another revision than its own.
MODEL_REVISION = "model_revision"
# Response parameter (int): prompt tokens of the whole batch.
PROMPT_TOKENS = "prompt_tokens"
# Triton's decoupled-model conventions on ModelStreamInfer: every response says whether it is the
# last of its request; a request may ask for that mark in an empty response of its own.
FINAL_RESPONSE = "triton_final_response"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"

INPUTS_METADATA: list[dict[str, Any]] = [
    {"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]},
    # Optional, or instead of text_input (the gRPC TensorMetadata message has no field to say so).
    {"name": CHAT_INPUT, "datatype": "BYTES", "shape": [-1]},
    {"name": IDS_INPUT, "datatype": "INT64", "shape": [-1, -1]},
    {"name": SAMPLING_INPUT, "datatype": "BYTES", "shape": [1]},
    {"name": STREAM_INPUT, "datatype": "BOOL", "shape": [1]},
]
OUTPUTS_METADATA: list[dict[str, Any]] = [
    {"name": TEXT_OUTPUT, "datatype": "BYTES", "shape": [-1]},
    {"name": FINISH_REASON, "datatype": "BYTES", "shape": [-1]},
    {"name": COMPLETION_TOKENS, "datatype": "INT32", "shape": [-1]},
    {"name": LOGPROBS_OUTPUT, "datatype": "BYTES", "shape": [-1]},
    {"name": PROMPT_LOGPROBS_OUTPUT, "datatype": "BYTES", "shape": [-1]},
    {"name": PROMPT_TEXT_OUTPUT, "datatype": "BYTES", "shape": [-1]},
]


@dataclass(frozen=True)
class TextRequest:
    # Exactly one of the two is non-empty: raw prompts (text_input, or input_ids: token ids) or
    # chat prompts (chat).
    prompts: list[CompletionPrompt]
    sampling: SamplingOptions
    # Request-level parameters other than sampling (e.g. the transformer's cache hints), kept verbatim.
    extra: dict[str, Any]
    chats: list[ChatPrompt] = field(default_factory=list)
    # One response per new text piece (ModelStreamInfer, generate_stream), else one per request.
    stream: bool = False

    @property
    def size(self) -> int:
        return len(self.chats) or len(self.prompts)


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


def decode_text(item: Any, index: int, name: str = TEXT_INPUT) -> str:
    """One element of a BYTES input as text; a 400 naming `name[index]` when it is not usable text."""
    if isinstance(item, bytes):
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"{name}[{index}] is not valid UTF-8", name) from None
    elif isinstance(item, str):
        text = item
        # JSON may carry a lone surrogate ("\ud800"): a Python str, but not text any tokenizer
        # can take (vLLM raised TypeError, a 500).
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{name}[{index}] is not valid UTF-8", name) from None
    else:
        raise BadRequest(f"{name}[{index}] must be a string", name)
    if "\x00" in text:
        raise BadRequest(f"{name}[{index}] contains a NUL character", name)
    if not text.strip():
        raise BadRequest(f"{name}[{index}] is empty", name)
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


def _chat(item: Any, index: int) -> ChatPrompt:
    text = decode_text(item, index, CHAT_INPUT)
    try:
        prompt = ChatPrompt.model_validate_json(text)
    except ValidationError as exc:
        error = validation_error(exc)
        raise BadRequest(f"{CHAT_INPUT}[{index}]: {error.message}", CHAT_INPUT) from None
    prompt.check()
    return prompt


def _stream_flag(request: InferRequest, params: dict[str, Any]) -> bool:
    stream_input = request.get_input_by_name(STREAM_INPUT)
    if stream_input is None:
        value = params.pop(STREAM_INPUT, False)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise BadRequest("parameter stream must be a boolean", STREAM_INPUT)
        return value
    if stream_input.datatype != "BOOL":
        raise BadRequest(f"{STREAM_INPUT} must have datatype BOOL, got {stream_input.datatype}", STREAM_INPUT)
    try:
        values = np.asarray(stream_input.as_numpy()).reshape(-1).tolist()
    except Exception as exc:
        raise BadRequest(f"{STREAM_INPUT}: data does not match its shape: {exc}", STREAM_INPUT) from None
    if len(values) != 1:
        raise BadRequest(f"{STREAM_INPUT} must hold exactly one value", STREAM_INPUT)
    params.pop(STREAM_INPUT, None)
    return bool(values[0])


def _token_prompts(inp: Any, max_batch: int) -> list[CompletionPrompt]:
    """input_ids: INT32 or INT64, [L] (one prompt) or [B, L]; each id non-negative (the predictor
    checks them against its vocabulary)."""
    if inp.datatype not in ("INT32", "INT64"):
        raise BadRequest(f"{IDS_INPUT} must have datatype INT32 or INT64, got {inp.datatype}", IDS_INPUT)
    shape = list(inp.shape)
    if not 1 <= len(shape) <= 2 or any(not isinstance(d, int) or d < 1 for d in shape):
        raise BadRequest(f"{IDS_INPUT} must have shape [L] or [B, L] with L >= 1, got {shape}", IDS_INPUT)
    try:
        rows = np.asarray(inp.as_numpy(), dtype=np.int64).reshape(-1, shape[-1]).tolist()
    except Exception as exc:  # numpy raises several types for data that doesn't fit the shape
        raise BadRequest(f"{IDS_INPUT}: data does not match shape {shape}: {exc}", IDS_INPUT) from None
    if len(rows) > max_batch:
        raise BadRequest(f"{IDS_INPUT} holds {len(rows)} prompts; at most {max_batch}", IDS_INPUT)
    if any(t < 0 for row in rows for t in row):
        raise BadRequest(f"{IDS_INPUT} must hold token ids (non-negative)", IDS_INPUT)
    return [TokenPrompt(tuple(row)) for row in rows]


def parse_request(request: InferRequest, max_batch: int) -> TextRequest:
    names = [i.name for i in request.inputs]
    known = (TEXT_INPUT, CHAT_INPUT, IDS_INPUT, SAMPLING_INPUT, STREAM_INPUT)
    unknown = [n for n in names if n not in known]
    if unknown:
        expected = f"{TEXT_INPUT!r}, {CHAT_INPUT!r} or {IDS_INPUT!r}"
        raise BadRequest(f"unknown input(s) {unknown}; expected {expected}", unknown[0])
    given = [n for n in (TEXT_INPUT, CHAT_INPUT, IDS_INPUT) if n in names]
    if len(given) > 1:
        raise BadRequest(f"send one of {TEXT_INPUT!r}, {CHAT_INPUT!r} and {IDS_INPUT!r}, not "
                         f"{' and '.join(repr(n) for n in given)}", given[-1])  # fmt: skip
    text_input = request.get_input_by_name(TEXT_INPUT)
    chat_input = request.get_input_by_name(CHAT_INPUT)
    ids_input = request.get_input_by_name(IDS_INPUT)
    prompt_input = text_input if text_input is not None else chat_input
    if prompt_input is None and ids_input is None:
        raise BadRequest(
            f"missing input {TEXT_INPUT!r} (BYTES, shape [B]) or {CHAT_INPUT!r} (BYTES, shape [B])",
            TEXT_INPUT,
        )
    prompts: list[CompletionPrompt] = []
    chats: list[ChatPrompt] = []
    if prompt_input is None:
        prompts = _token_prompts(ids_input, max_batch)
    else:
        items = _elements(prompt_input)
        if not items:
            raise BadRequest(f"{prompt_input.name} holds no prompts", prompt_input.name)
        if len(items) > max_batch:
            raise BadRequest(
                f"{prompt_input.name} holds {len(items)} prompts; at most {max_batch}", prompt_input.name
            )
        if text_input is not None:
            prompts = [decode_text(item, i) for i, item in enumerate(items)]
        else:
            chats = [_chat(item, i) for i, item in enumerate(items)]

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
    stream = _stream_flag(request, params)
    # `stop` may arrive as a JSON-encoded list in a string parameter (v2 parameters are scalars); a
    # plain string is one stop string. Other JSON-in-a-string values are decoded by parse_sampling.
    stop = params.get("stop")
    if isinstance(stop, str) and stop.startswith("["):
        try:
            params["stop"] = json.loads(stop)
        except json.JSONDecodeError:
            raise BadRequest("stop is not a valid JSON list", "stop") from None
    _response_format(chats, params)
    sampling = parse_sampling(params)
    extra = {k: v for k, v in params.items() if k not in sampling.to_dict()}
    return TextRequest(prompts=prompts, sampling=sampling, extra=extra, chats=chats, stream=stream)


def _response_format(chats: list[ChatPrompt], params: dict[str, Any]) -> None:
    """A chat's non-text `response_format`, or the tool call its `tool_choice` forces, as the
    request's structured-outputs constraint (one for the whole batch, as sampling is)."""
    asked = [chat.constraint() for chat in chats]
    if all(a is None for a in asked):
        return
    if any(a != asked[0] for a in asked):
        raise BadRequest("the chats of one request must ask for the same response_format and tool_choice",
                         CHAT_INPUT)  # fmt: skip
    field, constraint = asked[0]
    given = params.get("structured_outputs")
    # The transformer sends both: the chat as its client wrote it, and the constraint it maps to.
    if given is not None and structured_outputs(given) != structured_outputs(constraint):
        raise BadRequest(f"{field} and structured_outputs ask for different outputs: set one",
                         "structured_outputs")  # fmt: skip
    params["structured_outputs"] = constraint


def text_inputs(request: InferRequest) -> list[str]:
    """The `text_input` values as text, read leniently (for a log of what was asked, including
    requests that fail to parse): [] where there is nothing readable."""
    try:
        inp = request.get_input_by_name(TEXT_INPUT)
        values = [] if inp is None else list(np.asarray(inp.as_numpy(), dtype=object).reshape(-1))
    except Exception:  # a malformed request is recorded as what could be read of it: nothing
        return []
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]


def build_response(
    model_name: str,
    request_id: str | None,
    results: list[Answer],
    parameters: dict[str, Any] | None = None,
    extra_outputs: dict[str, list[str]] | None = None,
) -> InferResponse:
    batch = len(results)
    outputs = [
        InferOutput(TEXT_OUTPUT, [batch], "BYTES", [r.text for r in results]),
        InferOutput(FINISH_REASON, [batch], "BYTES", [r.finish_reason for r in results]),
        InferOutput(COMPLETION_TOKENS, [batch], "INT32", [int(r.completion_tokens) for r in results]),
    ]
    for name, of in ((LOGPROBS_OUTPUT, _own_logprobs), (PROMPT_LOGPROBS_OUTPUT, _prompt_logprobs)):
        if any(of(r) is not None for r in results):
            values = [json.dumps([t.to_json() for t in of(r) or ()]) for r in results]
            outputs.append(InferOutput(name, [batch], "BYTES", values))
    if any(r.prompt_text is not None for r in results):
        prompt_texts = [r.prompt_text or "" for r in results]
        outputs.append(InferOutput(PROMPT_TEXT_OUTPUT, [batch], "BYTES", prompt_texts))
    for name, values in (extra_outputs or {}).items():
        outputs.append(InferOutput(name, [len(values)], "BYTES", list(values)))
    return InferResponse(
        response_id=request_id or "",
        model_name=model_name,
        infer_outputs=outputs,
        parameters=parameters,
    )


def _own_logprobs(answer: Answer) -> Logprobs | None:
    return answer.logprobs


def _prompt_logprobs(answer: Answer) -> Logprobs | None:
    return answer.prompt_logprobs


def read_response(response: InferResponse) -> list[Answer]:
    """The inverse of build_response."""

    def column(name: str) -> list[Any]:
        out = response.get_output_by_name(name)
        return [] if out is None else list(np.asarray(out.as_numpy(), dtype=object).reshape(-1))

    return results_from_columns(column)


def results_from_columns(column: Callable[[str], list[Any] | None]) -> list[Answer]:
    """Answers from a response's output columns (`column(name)`: its flat values or None)."""

    def required(name: str) -> list[Any]:
        values = column(name)
        if not values and name == TEXT_OUTPUT:
            raise BadRequest(f"predictor response lacks output {name!r}", name)
        return list(values or [])

    def text(v: Any) -> str:
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    def logprobs(name: str) -> list[Logprobs | None]:
        reported = column(name)
        if not reported:
            return [None] * len(texts)
        try:
            return [tuple(TokenLogprob.from_json(t) for t in json.loads(text(v))) for v in reported]
        except (TypeError, ValueError) as exc:  # json's errors are ValueErrors
            raise BadRequest(f"predictor response's {name} is unreadable: {exc}", name) from None

    texts = required(TEXT_OUTPUT)
    reasons = required(FINISH_REASON) or [""] * len(texts)
    tokens = required(COMPLETION_TOKENS) or [0] * len(texts)
    own, of_prompt = logprobs(LOGPROBS_OUTPUT), logprobs(PROMPT_LOGPROBS_OUTPUT)
    prompt_texts = [text(v) for v in column(PROMPT_TEXT_OUTPUT) or []] or [None] * len(texts)
    return [
        Answer(text(t), text(r), int(n), logprobs=lp, prompt_logprobs=plp, prompt_text=pt)
        for t, r, n, lp, plp, pt in zip(texts, reasons, tokens, own, of_prompt, prompt_texts, strict=True)
    ]


@dataclass(frozen=True)
class StreamPart:
    """One response of a request on ModelStreamInfer / generate_stream; `final` marks its last."""

    response: InferResponse
    final: bool


def piece_response(
    model_name: str,
    request_id: str | None,
    size: int,
    index: int,
    piece: Answer,
    parameters: dict[str, Any] | None = None,
    extra_outputs: dict[str, list[str]] | None = None,
) -> InferResponse:
    """A streamed response of a batch of `size`: the new piece of prompt `index`, empty elsewhere
    (an unfinished prompt has finish_reason "")."""
    results = [piece if i == index else Answer("", "", 0) for i in range(size)]
    return build_response(model_name, request_id, results, parameters, extra_outputs)


def response_revision(response: InferResponse) -> str | None:
    """The `model_revision` response parameter (REST dict or gRPC map), or None when absent."""
    params = response.parameters
    if not params or not hasattr(params, "items"):
        return None
    value = next((_param_value(v) for k, v in params.items() if k == MODEL_REVISION), None)
    return str(value) if value not in (None, "") else None
