"""The OpenAI response objects both services send: completions, chat completions and their stream
chunks, usage, model cards.

Field for field (names, order, defaults) the `openai` package's own types (openai 1.x-3.x:
`openai.types.Completion`, `openai.types.chat.ChatCompletion`, ...), so that what we write is what
its client parses; tests/semserve/test_openai_wire.py compares the JSON of both for every builder in
semserve/openai_protocol.py. Ours because importing any of `openai.types` imports the whole `openai`
package (its HTTP clients, ~530 modules): ~0.9 s of a 2-core transformer start, for ten small
models. Nested objects we never send (audio, annotations, ...) are typed `Any`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

FinishReason = Literal["stop", "length", "content_filter"]
ChatFinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Wire(BaseModel):
    # As openai's BaseModel: fields it does not know are kept.
    model_config = ConfigDict(extra="allow")


class CompletionUsage(_Wire):
    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    completion_tokens_details: Any = None
    prompt_tokens_details: Any = None


class CompletionLogprobs(_Wire):
    """openai.types.completion_choice.Logprobs."""

    text_offset: list[int] | None = None
    # None at an echoed prompt's first token, which nothing predicts (as vLLM reports it).
    token_logprobs: list[float | None] | None = None
    tokens: list[str] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class CompletionChoice(_Wire):
    finish_reason: FinishReason
    index: int
    logprobs: CompletionLogprobs | None = None
    text: str


class Completion(_Wire):
    id: str
    choices: list[CompletionChoice]
    created: int
    model: str
    object: Literal["text_completion"]
    system_fingerprint: str | None = None
    usage: CompletionUsage | None = None


class Function(_Wire):
    """openai.types.chat.chat_completion_message_function_tool_call.Function."""

    arguments: str
    name: str


class ChatCompletionMessageFunctionToolCall(_Wire):
    id: str
    function: Function
    type: Literal["function"]


class ChatCompletionMessage(_Wire):
    content: str | None = None
    refusal: str | None = None
    role: Literal["assistant"]
    annotations: Any = None
    audio: Any = None
    function_call: Any = None
    tool_calls: list[ChatCompletionMessageFunctionToolCall] | None = None


class TopLogprob(_Wire):
    """openai.types.chat.chat_completion_token_logprob.TopLogprob."""

    token: str
    bytes: list[int] | None = None
    logprob: float


class ChatCompletionTokenLogprob(_Wire):
    token: str
    bytes: list[int] | None = None
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Wire):
    """openai.types.chat.chat_completion.ChoiceLogprobs (and the chunk's, field for field)."""

    content: list[ChatCompletionTokenLogprob] | None = None
    refusal: list[ChatCompletionTokenLogprob] | None = None


class ChatChoice(_Wire):
    finish_reason: ChatFinishReason
    index: int
    logprobs: ChoiceLogprobs | None = None
    message: ChatCompletionMessage


class ChatCompletion(_Wire):
    id: str
    choices: list[ChatChoice]
    created: int
    model: str
    object: Literal["chat.completion"]
    metadata: dict[str, str] | None = None
    moderation: Any = None
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: CompletionUsage | None = None


class ChoiceDeltaToolCallFunction(_Wire):
    arguments: str | None = None
    name: str | None = None


class ChoiceDeltaToolCall(_Wire):
    index: int
    id: str | None = None
    function: ChoiceDeltaToolCallFunction | None = None
    type: Literal["function"] | None = None


class ChoiceDelta(_Wire):
    audio: Any = None
    content: str | None = None
    function_call: Any = None
    refusal: str | None = None
    role: Literal["developer", "system", "user", "assistant", "tool"] | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChunkChoice(_Wire):
    delta: ChoiceDelta
    index: int
    finish_reason: ChatFinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_Wire):
    id: str
    choices: list[ChunkChoice]
    created: int
    model: str
    object: Literal["chat.completion.chunk"]
    moderation: Any = None
    obfuscation: str | None = None
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: CompletionUsage | None = None


class OpenAIModelCard(_Wire):
    """openai.types.Model."""

    id: str
    created: int
    object: Literal["model"]
    owned_by: str
    shutdown_date: str | None = None
