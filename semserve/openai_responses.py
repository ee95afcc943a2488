"""OpenAI's Responses API (`POST /v1/responses`) on both services, as a translation to and from chat
completions. A request becomes the chat it means: `instructions` a system message first, `input`
items messages (function calls and their outputs the chat's tool calls and tool messages), function
tools chat tools, `text.format` a response_format, `max_output_tokens` max_completion_tokens. The
backend answers that chat as any other (the transformer from its cache: a question asked through
either API is one entry), and the answer becomes a response object, or its stream the Responses
events (`ResponseEvents`).

Stateless, as vLLM's server is without its response store: `store` is accepted and nothing is kept,
so `previous_response_id`, `background` and `conversation` are a 400 that says to send the whole
conversation in `input`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from semserve.errors import BadRequest, ServingError
from semserve.openai_protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    EncodableRequest,
    validation_error,
)
from semserve.openai_tools import CalledFunction, FunctionSpec, ToolCallMessage
from semserve.openai_wire import ChoiceLogprobs
from semserve.responses_wire import (
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputTokensDetails,
    Response,
    ResponseContentPartEvent,
    ResponseError,
    ResponseErrorEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseLifecycleEvent,
    ResponseOutputItemEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from semserve.sampling import MAX_LOGPROBS

_TEXT_PARTS = ("input_text", "output_text")
_ITEMS = ("message", "function_call", "function_call_output")
# Chat fields with a Responses field of their own (or none: one response has one answer).
_CHAT_ONLY = ("messages", "n", "max_tokens", "max_completion_tokens", "response_format", "logprobs")
# The one `include` this server serves: each output token's logprob (with `top_logprobs`
# alternatives), as the chat's logprobs.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class InputTextPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # output_text's annotations and logprobs, unread

    type: Literal["input_text", "output_text"]
    text: str


def _text_parts_only(value: Any) -> Any:
    if isinstance(value, list):
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in _TEXT_PARTS:
                raise ValueError(f"part {i} has type {kind!r}: this model takes text only "
                                 "(type 'input_text')")
    return value


def _text(content: str | list[InputTextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="allow")  # an earlier output's id and status, unread

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart]

    _parts = field_validator("content", mode="before")(_text_parts_only)


class FunctionCallItem(BaseModel):
    """A call the model made earlier in the conversation."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(BaseModel):
    """What the caller's function returned for a call."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputTextPart]

    _parts = field_validator("output", mode="before")(_text_parts_only)


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]
_INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(InputItem)


class FunctionTool(FunctionSpec):
    """A function the model may call: the chat's function, its type beside it rather than above."""

    type: Literal["function"]


class FunctionChoice(BaseModel):
    """`tool_choice: {"type": "function", "name": ...}`: call this function."""

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON under a schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def response_format(self) -> dict[str, Any] | None:
        """The chat's response_format for the same constraint."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.schema_ is None:
            raise BadRequest("text.format json_schema needs schema (an object)", "text")
        spec = {"name": self.name or "response", "schema": self.schema_, "strict": self.strict}
        return {"type": "json_schema", "json_schema": spec}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow")  # verbosity: this model has one

    format: TextFormat | None = None


class ResponsesRequest(EncodableRequest):
    # Unknown fields go on to the chat: vLLM's sampling extensions (top_k, seed, stop, ...) mean
    # there what they mean on the chat route, and other unknown fields are ignored there.
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 2})
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None  # a stored prompt template's id
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, Any] | None = None
    top_logprobs: int | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        # Said here, or pydantic's discriminated-union errors read as riddles.
        if isinstance(value, list):
            if not value:
                raise ValueError("input must not be an empty list")
            value = list(value)  # the caller's list stays as it was
            for i, item in enumerate(value):
                if isinstance(item, dict) and "type" not in item and "role" in item:
                    value[i] = item = {**item, "type": "message"}  # EasyInputMessage: type optional
                kind = item.get("type") if isinstance(item, dict) else None
                if isinstance(kind, str) and kind not in _ITEMS:
                    raise ValueError(f"item {i} has type {kind!r}: this server takes messages, "
                                     "function_call and function_call_output items")  # fmt: skip
                try:
                    _INPUT_ITEM.validate_python(item)
                except ValidationError as exc:  # its own error, not the union's "a valid string"
                    raise ValueError(f"item {i}: {validation_error(exc).message}") from None
        elif isinstance(value, str) and not value.strip():
            raise ValueError("input must not be empty")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise ValueError(f"tool {i} has type {kind!r}: this server calls functions only "
                                 "(type 'function')")
        return value

    def unsupported(self) -> None:
        """A 400 for what needs a response store or a capability this server has not."""
        stored = (("previous_response_id", self.previous_response_id), ("conversation", self.conversation),
                  ("background", self.background or None), ("prompt", self.prompt))  # fmt: skip
        for name, value in stored:
            if value is not None:
                raise BadRequest(f"{name} needs responses stored by the server, and this server stores "
                                 "none: send the whole conversation in input", name)  # fmt: skip
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            message = f"max_output_tokens must be >= 1, got {self.max_output_tokens}"
            raise BadRequest(message, "max_output_tokens")
        other = [i for i in self.include or [] if i != LOGPROBS_INCLUDE]
        if other:
            raise BadRequest(f"include {other[0]!r} is not supported (only {LOGPROBS_INCLUDE!r})", "include")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            message = f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}"
            raise BadRequest(message, "top_logprobs")
        if self.truncation == "auto":
            raise BadRequest("truncation 'auto' is not supported: an input past the context is a 400",
                             "truncation")
        effort = (self.reasoning or {}).get("effort")
        if effort not in (None, "none"):
            raise BadRequest(f"reasoning effort {effort!r}: this model does not reason", "reasoning")
        for i, m in enumerate(self.messages()):
            if "\x00" in m.text:
                raise BadRequest(f"input contains a NUL character (message {i})", "input")

    @property
    def reports_logprobs(self) -> bool:
        # top_logprobs alone reports nothing, as in vLLM: the include asks for them.
        return LOGPROBS_INCLUDE in (self.include or [])

    def messages(self) -> list[ChatMessage]:
        """The chat's messages: the instructions, then the input items in order; consecutive
        function calls are one assistant message with their tool calls."""
        messages: list[ChatMessage] = []
        if self.instructions:
            messages.append(ChatMessage(role="system", content=self.instructions))
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append(ChatMessage(role=item.role, content=_text(item.content)))
            elif isinstance(item, FunctionCallOutputItem):
                output = _text(item.output)
                messages.append(ChatMessage(role="tool", content=output, tool_call_id=item.call_id))
            else:
                call = ToolCallMessage(id=item.call_id, function=CalledFunction(name=item.name,
                                                                                arguments=item.arguments))
                last = messages[-1] if messages else None
                if last is not None and last.role == "assistant" and last.tool_calls:
                    last.tool_calls.append(call)
                else:
                    messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        return messages

    def chat_request(self) -> ChatCompletionRequest:
        """The chat this request means; its errors name the Responses fields."""
        chat: dict[str, Any] = {
            **(self.model_extra or {}),
            "model": self.model,
            "messages": self.messages(),
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "tools": self._chat_tools(),
            "tool_choice": self._chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": self.text.format.response_format() if self.text and self.text.format else None,
            "stream": self.stream,
            # The last chunk's usage is the response's.
            "stream_options": {"include_usage": True} if self.stream else None,
            "user": self.user,
        }
        if self.reports_logprobs:
            chat |= {"logprobs": True, "top_logprobs": self.top_logprobs or 0}
        for own in _CHAT_ONLY:
            if own in (self.model_extra or {}):
                raise BadRequest(f"{own} is a chat completions field: /v1/responses does not take it", own)
        try:
            req = ChatCompletionRequest.model_validate(chat)
        except ValidationError as exc:
            raise _renamed(validation_error(exc)) from None
        try:
            req.unsupported()
        except BadRequest as exc:
            raise _renamed(exc) from None
        return req

    def _chat_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                for t in self.tools]  # fmt: skip

    def _chat_tool_choice(self) -> Any:
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            return {"type": "function", "function": {"name": choice.name}}
        if choice is None and self.tools:
            # OpenAI's default with tools is "auto", which the chat route answers with its 400.
            return "auto"
        return choice


# The chat's fields, as a Responses client named them.
_RESPONSES_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text",
}


def _renamed(exc: BadRequest) -> BadRequest:
    name = _RESPONSES_NAMES.get(exc.field or "", exc.field)
    message = exc.message
    for chat_name, ours in _RESPONSES_NAMES.items():
        message = message.replace(chat_name, ours)
    return type(exc)(message, name)


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def _item_id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


def _usage(prompt_tokens: int, completion_tokens: int) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=prompt_tokens,
        input_tokens_details=InputTokensDetails(cache_write_tokens=0, cached_tokens=0),
        output_tokens=completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=prompt_tokens + completion_tokens,
    )


class ResponseShape:
    """What every response object of one request repeats of it, and builds that object."""

    def __init__(self, req: ResponsesRequest, response_id: str | None = None) -> None:
        self.req = req
        self.id = response_id or new_response_id()
        self.created_at = float(int(time.time()))

    def response(
        self,
        status: Literal["in_progress", "completed", "incomplete", "failed"],
        output: list[OutputItem],
        usage: ResponseUsage | None = None,
        error: ResponseError | None = None,
    ) -> Response:
        req = self.req
        text_format = req.text.format if req.text and req.text.format else None
        choice = req.tool_choice
        return Response(
            id=self.id,
            created_at=self.created_at,
            error=error,
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete"
            else None,
            instructions=req.instructions,
            metadata=req.metadata,
            model=req.model,
            object="response",
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=req.temperature,
            tool_choice=choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
            top_p=req.top_p,
            max_output_tokens=req.max_output_tokens,
            status=status,
            text={"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                  else {"type": "text"}},
            truncation=req.truncation or "disabled",
            usage=usage,
            user=req.user,
        )


def response_of(shape: ResponseShape, chat: ChatCompletion) -> Response:
    """A whole chat answer as the response object."""
    [choice] = chat.choices
    output: list[OutputItem] = [
        ResponseFunctionToolCall(arguments=c.function.arguments, call_id=c.id, name=c.function.name,
                                 type="function_call", id=_item_id("fc"), status="completed")
        for c in choice.message.tool_calls or []
    ]  # fmt: skip
    incomplete = choice.finish_reason == "length"
    if not output:
        text = ResponseOutputText(annotations=[], text=choice.message.content or "", type="output_text",
                                  logprobs=_logprobs(choice.logprobs) if shape.req.reports_logprobs else None)
        output.append(ResponseOutputMessage(id=_item_id("msg"), content=[text], role="assistant",
                                            status="incomplete" if incomplete else "completed",
                                            type="message"))  # fmt: skip
    usage = _usage(chat.usage.prompt_tokens, chat.usage.completion_tokens) if chat.usage else None
    return shape.response("incomplete" if incomplete else "completed", output, usage)


def _logprobs(chat: ChoiceLogprobs | None) -> list[dict[str, Any]]:
    """A chat's logprobs as a response's output text reports them (openai's Logprob)."""
    return [
        {"token": t.token, "bytes": t.bytes or list(t.token.encode()), "logprob": t.logprob,
         "top_logprobs": [{"token": a.token, "bytes": a.bytes or list(a.token.encode()), "logprob": a.logprob}
                          for a in t.top_logprobs]}
        for t in (chat.content or [] if chat is not None else [])
    ]  # fmt: skip


class ResponseEvents:
    """A chat's chunk stream as the Responses stream: response.created and .in_progress, each output
    item opened, its text or arguments as they come, each item closed, then response.completed (or
    .incomplete) with the whole response; an error on the way is an `error` event, then
    response.failed."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self._seq = 0
        self._output: list[OutputItem] = []
        self._text: ResponseOutputMessage | None = None  # the message being written
        self._calls: dict[int, ResponseFunctionToolCall] = {}  # calls being written, by chunk index
        self._usage: ResponseUsage | None = None
        self._incomplete = False
        # Logprobs of tokens whose text has not come yet (a character split over tokens): they
        # ride with the next text delta.
        self._pending: list[dict[str, Any]] = []

    def _n(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _lifecycle(self, kind: Any, status: Any, error: ResponseError | None = None) -> ResponseStreamEvent:
        output = list(self._output) if status != "in_progress" else []
        response = self.shape.response(status, output, self._usage, error)
        return ResponseLifecycleEvent(response=response, sequence_number=self._n(), type=kind)

    def _item(self, kind: Any, item: OutputItem) -> ResponseStreamEvent:
        return ResponseOutputItemEvent(item=item.model_copy(deep=True), output_index=self._output.index(item),
                                       sequence_number=self._n(), type=kind)  # fmt: skip

    def _part(self, kind: Any, item: ResponseOutputMessage) -> ResponseStreamEvent:
        return ResponseContentPartEvent(
            content_index=0, item_id=item.id, output_index=self._output.index(item),
            part=item.content[0].model_copy(), sequence_number=self._n(), type=kind)

    async def events(self, chunks: AsyncIterator[ChatCompletionChunk]) -> AsyncIterator[ResponseStreamEvent]:
        yield self._lifecycle("response.created", "in_progress")
        yield self._lifecycle("response.in_progress", "in_progress")
        try:
            async for chunk in chunks:
                for event in self._of(chunk):
                    yield event
        except ServingError as exc:
            code = "server_error" if exc.http_status >= 500 else "invalid_request_error"
            yield ResponseErrorEvent(code=code, message=exc.message, param=exc.field,
                                     sequence_number=self._n(), type="error")  # fmt: skip
            failure = ResponseError(code="server_error", message=exc.message)
            yield self._lifecycle("response.failed", "failed", failure)
            return
        if not self._output:  # an empty answer is still a message
            for event in self._text_piece(""):
                yield event
        for event in self._close_all():
            yield event
        status = "incomplete" if self._incomplete else "completed"
        yield self._lifecycle(f"response.{status}", status)

    def _of(self, chunk: ChatCompletionChunk) -> list[ResponseStreamEvent]:
        if chunk.usage is not None:
            self._usage = _usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        events: list[ResponseStreamEvent] = []
        for choice in chunk.choices:
            delta = choice.delta
            if self.shape.req.reports_logprobs:
                self._pending += _logprobs(choice.logprobs)
            if delta.content:
                events += self._text_piece(delta.content)
            for call in delta.tool_calls or []:
                function = call.function
                name, arguments = (function.name, function.arguments or "") if function else (None, "")
                events += self._call_piece(call.index, call.id, name, arguments)
            if choice.finish_reason is not None:
                self._incomplete = choice.finish_reason == "length"
        return events

    def _text_piece(self, text: str) -> list[ResponseStreamEvent]:
        events: list[ResponseStreamEvent] = []
        item = self._text
        if item is None:
            item = self._text = ResponseOutputMessage(id=_item_id("msg"), content=[], role="assistant",
                                                      status="in_progress", type="message")  # fmt: skip
            self._output.append(item)
            events.append(self._item("response.output_item.added", item))
            logprobs: list[Any] | None = [] if self.shape.req.reports_logprobs else None
            item.content.append(ResponseOutputText(annotations=[], text="", type="output_text",
                                                   logprobs=logprobs))  # fmt: skip
            events.append(self._part("response.content_part.added", item))
        if text:
            part = item.content[0]
            part.text += text
            these, self._pending = self._pending, []
            if part.logprobs is not None:
                part.logprobs = part.logprobs + these  # a new list: events already made keep theirs
            events.append(ResponseTextDeltaEvent(
                content_index=0, delta=text, item_id=item.id, logprobs=these,
                output_index=self._output.index(item), sequence_number=self._n(),
                type="response.output_text.delta"))
        return events

    def _call_piece(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[Any]:
        events: list[ResponseStreamEvent] = []
        item = self._calls.get(index)
        if item is None:
            item = self._calls[index] = ResponseFunctionToolCall(
                arguments="", call_id=call_id or _item_id("call"), name=name or "", type="function_call",
                id=_item_id("fc"), status="in_progress")
            self._output.append(item)
            events.append(self._item("response.output_item.added", item))
        if arguments:
            item.arguments += arguments
            events.append(ResponseFunctionCallArgumentsDeltaEvent(
                delta=arguments, item_id=item.id or "", output_index=self._output.index(item),
                sequence_number=self._n(), type="response.function_call_arguments.delta"))
        return events

    def _close_all(self) -> list[ResponseStreamEvent]:
        events: list[ResponseStreamEvent] = []
        item = self._text
        if item is not None:
            part = item.content[0]
            if part.logprobs is not None:
                part.logprobs = part.logprobs + self._pending  # tokens whose text never came whole
            self._pending = []
            events.append(ResponseTextDoneEvent(
                content_index=0, item_id=item.id, logprobs=list(part.logprobs or []),
                output_index=self._output.index(item), sequence_number=self._n(), text=part.text,
                type="response.output_text.done"))
            events.append(self._part("response.content_part.done", item))
            item.status = "incomplete" if self._incomplete else "completed"
            events.append(self._item("response.output_item.done", item))
            self._text = None
        for call in self._calls.values():
            events.append(ResponseFunctionCallArgumentsDoneEvent(
                arguments=call.arguments, item_id=call.id or "", output_index=self._output.index(call),
                sequence_number=self._n(), type="response.function_call_arguments.done"))
            call.status = "completed"
            events.append(self._item("response.output_item.done", call))
        self._calls = {}
        return events
