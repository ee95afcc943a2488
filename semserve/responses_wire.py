"""The OpenAI Responses API objects both services send: the response, its output items, its usage and
the events of its stream.

As semserve/openai_wire.py: field for field the `openai` package's own types (`openai.types.responses`),
ours so that a service start does not import the `openai` package; tests/semserve/test_responses_wire.py
checks that openai's types read what the builders in semserve/openai_responses.py write. Fields for
things these services never send (reasoning, images, tool kinds other than functions) are left out.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponseOutputText(_Wire):
    annotations: list[Any]
    text: str
    type: Literal["output_text"]
    logprobs: list[Any] | None = None


class ResponseOutputMessage(_Wire):
    id: str
    content: list[ResponseOutputText]
    role: Literal["assistant"]
    status: ItemStatus
    type: Literal["message"]


class ResponseFunctionToolCall(_Wire):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"]
    id: str | None = None
    status: ItemStatus | None = None


OutputItem = ResponseOutputMessage | ResponseFunctionToolCall


class InputTokensDetails(_Wire):
    cache_write_tokens: int
    cached_tokens: int


class OutputTokensDetails(_Wire):
    reasoning_tokens: int


class ResponseUsage(_Wire):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Wire):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


class ResponseError(_Wire):
    code: str
    message: str


class Response(_Wire):
    id: str
    created_at: float
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    model: str
    object: Literal["response"]
    output: list[OutputItem]
    parallel_tool_calls: bool
    temperature: float | None = None
    tool_choice: Any
    tools: list[Any]
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    status: ResponseStatus | None = None
    text: Any = None
    truncation: Literal["auto", "disabled"] | None = None
    usage: ResponseUsage | None = None
    user: str | None = None


# -- stream events: each names its type and its place in the stream (sequence_number) --------------


class ResponseLifecycleEvent(_Wire):
    """response.created, .in_progress, .completed, .incomplete and .failed: the response so far."""

    response: Response
    sequence_number: int
    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete",
        "response.failed",
    ]  # fmt: skip


class ResponseOutputItemEvent(_Wire):
    """response.output_item.added and .done."""

    item: OutputItem
    output_index: int
    sequence_number: int
    type: Literal["response.output_item.added", "response.output_item.done"]


class ResponseContentPartEvent(_Wire):
    """response.content_part.added and .done."""

    content_index: int
    item_id: str
    output_index: int
    part: ResponseOutputText
    sequence_number: int
    type: Literal["response.content_part.added", "response.content_part.done"]


class ResponseTextDeltaEvent(_Wire):
    content_index: int
    delta: str
    item_id: str
    logprobs: list[Any]
    output_index: int
    sequence_number: int
    type: Literal["response.output_text.delta"]


class ResponseTextDoneEvent(_Wire):
    content_index: int
    item_id: str
    logprobs: list[Any]
    output_index: int
    sequence_number: int
    text: str
    type: Literal["response.output_text.done"]


class ResponseFunctionCallArgumentsDeltaEvent(_Wire):
    delta: str
    item_id: str
    output_index: int
    sequence_number: int
    type: Literal["response.function_call_arguments.delta"]


class ResponseFunctionCallArgumentsDoneEvent(_Wire):
    arguments: str
    item_id: str
    output_index: int
    sequence_number: int
    type: Literal["response.function_call_arguments.done"]


class ResponseErrorEvent(_Wire):
    code: str | None = None
    message: str
    param: str | None = None
    sequence_number: int
    type: Literal["error"]


ResponseStreamEvent = (
    ResponseLifecycleEvent
    | ResponseOutputItemEvent
    | ResponseContentPartEvent
    | ResponseTextDeltaEvent
    | ResponseTextDoneEvent
    | ResponseFunctionCallArgumentsDeltaEvent
    | ResponseFunctionCallArgumentsDoneEvent
    | ResponseErrorEvent
)
