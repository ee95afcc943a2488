"""OpenAI wire format shared by both services: request models, and builders for the response
types (semserve/openai_wire.py: field for field the `openai` package's own, so what we send is
exactly what its client parses).

The `openai` package ships request *TypedDicts* only; validating those with pydantic yields lazy
iterators and unreadable errors, so requests get small pydantic models here, with the field names
and meanings of the OpenAI API (plus vLLM's `top_k` and `ignore_eos` extensions).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from semserve.answer import Logprobs
from semserve.errors import BadRequest
from semserve.openai_tools import (
    ToolCall,
    ToolCallMessage,
    ToolChoice,
    ToolSpec,
    ToolUse,
    new_call_id,
    tool_use,
)
from semserve.openai_wire import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionTokenLogprob,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
    Function,
    OpenAIModelCard,
    TopLogprob,
)
from semserve.sampling import MAX_LOGPROBS, SamplingOptions, parse_sampling

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Completion",
    "CompletionRequest",
    "OpenAIModelCard",
]

FinishReason = Literal["stop", "length"]


class StreamOptions(BaseModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk also carries the usage so far.
    continuous_usage_stats: bool = False


@dataclass(frozen=True)
class UsageReport:
    """Where a stream reports usage: in a last chunk of its own (`final`, OpenAI's include_usage),
    and in every chunk as it goes (`continuous`, vLLM's continuous_usage_stats)."""

    final: bool = False
    continuous: bool = False

    def so_far(self, prompt_tokens: int, completion_tokens: int) -> CompletionUsage | None:
        """A chunk's usage: the counts so far when continuous, else None (null on the wire)."""
        return usage(prompt_tokens, completion_tokens) if self.continuous else None


class EncodableRequest(BaseModel):
    """A request the services can write out again as JSON (to the predictor, to logs): JSON may carry
    lone surrogates (a "\\ud800" escape) anywhere, in unknown fields and free-form objects too, which UTF-8
    cannot encode; such a request is a 400 here rather than a failure when it is sent on."""

    @model_validator(mode="after")
    def _writable_as_json(self) -> EncodableRequest:
        try:
            self.model_dump_json()
        except ValueError as exc:  # UnicodeEncodeError, PydanticSerializationError
            where = _not_utf8(self.model_dump()) or "the request"
            raise ValueError(f"{where} is not valid UTF-8 (a lone surrogate)") from exc
        return self


def _not_utf8(value: Any, path: str = "") -> str | None:
    """The path of the first string (or key) in `value` that UTF-8 cannot encode, e.g.
    "messages[0].content"; None when there is none."""
    if isinstance(value, str):
        return None if _utf8(value) else path or "a value"
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and not _utf8(key):
                return f"a key of {path}" if path else "a field name"
            found = _not_utf8(item, inner)
            if found:
                return found
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _not_utf8(item, f"{path}[{i}]")
            if found:
                return found
    return None


# vLLM's request fields that change what is answered and that these services do not honour, with
# their defaults: set to anything else, a 400 names them rather than dropping them silently (other
# unknown fields are ignored, as vLLM ignores them).
_NOT_HONOURED: dict[str, Any] = {
    "use_beam_search": False,
    "length_penalty": 1.0,
    "prompt_logprobs": None,
    "allowed_token_ids": None,
    "bad_words": [],
    "logits_processors": None,
    "truncate_prompt_tokens": None,
    "spaces_between_special_tokens": True,
    "return_token_ids": False,
    "return_tokens_as_token_ids": False,
    "prompt_embeds": None,
}


# What to ask instead, where something here gives the same.
_INSTEAD = {"prompt_logprobs": " (completions report a prompt's logprobs with echo and logprobs)"}

# vLLM's older names of its structured-outputs constraints.
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_of(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's `response_format` as a structured-outputs constraint (None: plain text), as vLLM
    maps it; a 400 for a type it has none for."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            message = "response_format json_schema needs json_schema.schema (an object)"
            raise BadRequest(message, "response_format")
        return {"json": schema}
    raise BadRequest(f"response_format type {kind!r} is not supported (text, json_object or json_schema)",
                     "response_format")


class _SamplingFields(EncodableRequest):
    # Unknown fields are accepted and ignored, as OpenAI-compatible servers do; fields we know but
    # cannot honour are rejected in `unsupported()` so nothing is silently dropped.
    model_config = ConfigDict(extra="allow")

    model: str
    # `json_schema_extra` documents in the OpenAPI document what `unsupported()` and `sampling()`
    # accept (so clients and schemathesis send it); validation stays where it is.
    max_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 2})
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    n: int = Field(1, json_schema_extra={"minimum": 1})
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, json_schema_extra={"minimum": -2, "maximum": 2})
    frequency_penalty: float | None = Field(None, json_schema_extra={"minimum": -2, "maximum": 2})
    # vLLM's extensions of OpenAI's sampling fields, as its server takes them.
    repetition_penalty: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0})
    min_p: float | None = Field(None, json_schema_extra={"minimum": 0, "maximum": 1})
    min_tokens: int | None = Field(None, json_schema_extra={"minimum": 0})
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    # vLLM's structured outputs: one constraint (json, regex, choice, grammar or json_object).
    structured_outputs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None  # OpenAI's way to ask for JSON
    logit_bias: dict[str, float] | None = None
    # vLLM's: tokens per streamed chunk after the first; raises the server's --stream-interval.
    stream_interval: int | None = Field(None, json_schema_extra={"minimum": 1})
    user: str | None = None

    def unsupported(self) -> None:
        if self.n < 1:
            raise BadRequest(f"n must be >= 1, got {self.n}", "n")
        for name, value in (self.model_extra or {}).items():
            if name in _NOT_HONOURED and value not in (None, _NOT_HONOURED[name]):
                hint = _INSTEAD.get(name, "")
                raise BadRequest(f"{name} is not supported by this model server{hint}", name)
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options is only allowed with stream: true", "stream_options")

    def sampling(self, default_max_tokens: int) -> SamplingOptions:
        params = {
            "max_tokens": self.effective_max_tokens()
            if self.effective_max_tokens() is not None
            else default_max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "min_p": self.min_p,
            "min_tokens": self.min_tokens,
            "stop_token_ids": self.stop_token_ids,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "logprobs": self.logprobs_asked(),
            "prompt_logprobs": self.prompt_logprobs_asked(),
            "structured_outputs": self.structured(),
            "logit_bias": self.logit_bias,
            "stream_interval": self.stream_interval,
        }
        return parse_sampling(params)

    def structured(self) -> dict[str, Any] | None:
        """The one structured-outputs constraint asked for: vLLM's `structured_outputs`, its older
        `guided_*` fields, or OpenAI's `response_format`; asking in two ways is a 400."""
        guided = {k.removeprefix("guided_"): v for k, v in (self.model_extra or {}).items()
                  if k in _GUIDED and v is not None}  # fmt: skip
        asked = [(name, c) for name, c in (("structured_outputs", self.structured_outputs),
                                            ("guided_*", guided or None),
                                            self._chat_constraint() or ("", None))
                 if c is not None]  # fmt: skip
        if len(asked) > 1:
            names = " and ".join(name for name, _ in asked)
            raise BadRequest(f"{names} both constrain the output: set one", asked[1][0])
        return asked[0][1] if asked else None

    def _chat_constraint(self) -> tuple[str, dict[str, Any]] | None:
        """The constraint the request's own fields ask for, with the field that asks."""
        constraint = structured_of(self.response_format)
        return ("response_format", constraint) if constraint is not None else None

    def logprobs_asked(self) -> int | None:
        """How many most likely tokens to report beside each generated one; None: no logprobs."""
        return None

    def prompt_logprobs_asked(self) -> int | None:
        """The same for each prompt token; None: none."""
        return None

    def check_choices(self, prompts: int, max_batch_size: int) -> None:
        """Prompts times choices is what runs at once: a 400 past --max-batch-size."""
        if prompts * self.n <= max_batch_size:
            return
        if self.n == 1:
            raise BadRequest(f"at most {max_batch_size} prompts per request", "prompt")
        what = f"{prompts} prompts x n={self.n}" if prompts > 1 else f"n={self.n}"
        raise BadRequest(f"at most {max_batch_size} choices per request ({what})", "n")

    def choices(self, options: SamplingOptions) -> list[SamplingOptions]:
        """The sampling options of each of the `n` choices (see SamplingOptions.for_choice)."""
        return [options.for_choice(i) for i in range(self.n)]

    def effective_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def usage_report(self) -> UsageReport:
        options = self.stream_options or StreamOptions()
        # vLLM's continuous_usage_stats counts only with include_usage, as vLLM's server reads it.
        return UsageReport(options.include_usage, options.include_usage and options.continuous_usage_stats)


def _prompt_schema(schema: dict[str, Any]) -> None:
    # What `_prompt` accepts: text with something besides whitespace, or token ids, alone or in a
    # non-empty list.
    text = {"type": "string", "pattern": r"\S"}
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    schema.pop("anyOf", None)
    schema["anyOf"] = [text, {"type": "array", "items": text, "minItems": 1}, ids,
                       {"type": "array", "items": ids, "minItems": 1}]  # fmt: skip


# Past any vocabulary, and what INT32/INT64 tensors on the predictor's v2 hop carry.
MAX_TOKEN_ID = 2**31


@dataclass(frozen=True)
class TokenPrompt:
    """A completion prompt given as token ids (vLLM's, e.g. lm-evaluation-harness's default): the
    model reads them as they are. Never cached: a cache key is text, and these have none."""

    ids: tuple[int, ...]


# A completion's prompt: text, or token ids.
CompletionPrompt = str | TokenPrompt


class CompletionRequest(_SamplingFields):
    # Text or token ids (StrictInt: `true` is no token id), one prompt or a batch.
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(
        json_schema_extra=_prompt_schema
    )
    # 0 only with echo: the prompt's logprobs alone, nothing generated (vLLM's "echo without
    # generation", how evaluation harnesses score a text).
    max_tokens: int | None = Field(None, json_schema_extra={"minimum": 0})
    echo: bool | None = False  # vLLM takes null as false
    # The most likely tokens to report beside each generated one (0: its own logprob only).
    logprobs: int | None = Field(None, json_schema_extra={"minimum": 0, "maximum": MAX_LOGPROBS})
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        # Said here, or the union's errors read "Input should be a valid string" for [true].
        def ids(x: Any) -> bool:
            return isinstance(x, list) and all(type(t) is int for t in x)

        if isinstance(v, str) or v == [] or ids(v):
            return v
        if isinstance(v, list) and (all(isinstance(p, str) for p in v) or all(ids(p) for p in v)):
            return v
        raise ValueError("prompt must be a string, a list of strings, a list of token ids (integers) or "
                         "a list of such lists")  # fmt: skip

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        prompts = [v] if isinstance(v, str) or (v and isinstance(v[0], int)) else v
        if not prompts:
            raise ValueError("prompt must not be an empty list")
        for p in prompts:
            if isinstance(p, list):
                if not p:
                    raise ValueError("prompt must not be an empty list of token ids")
                if any(not 0 <= t < MAX_TOKEN_ID for t in p):  # the predictor checks its vocabulary
                    raise ValueError(f"prompt token ids must be in [0, {MAX_TOKEN_ID})")
                continue
            if not p.strip():
                raise ValueError("prompt must not be empty")
            if "\x00" in p:
                raise ValueError("prompt contains a NUL character")
            if not _utf8(p):
                raise ValueError("prompt is not valid UTF-8 (lone surrogate)")
        return v

    @property
    def prompts(self) -> list[CompletionPrompt]:
        """Each prompt: its text, or its token ids."""
        v = self.prompt
        if isinstance(v, str):
            return [v]
        if isinstance(v[0], int):
            return [TokenPrompt(tuple(v))]  # type: ignore[arg-type]
        return [p if isinstance(p, str) else TokenPrompt(tuple(p)) for p in v]  # type: ignore[arg-type]

    def echoes(self) -> Echo:
        # Token ids echo as the text the predictor decodes them to (the answer's prompt_text).
        texts = [p if isinstance(p, str) else None for p in self.prompts]
        return Echo(texts if self.echo else None, self.n, generates=not self._echo_only)

    @property
    def _echo_only(self) -> bool:
        return bool(self.echo) and self.max_tokens == 0

    def effective_max_tokens(self) -> int | None:
        # As vLLM: echo without generation still runs one step (the prompt's logprobs come with
        # it); the token it makes is left out of the choice.
        return 1 if self._echo_only else self.max_tokens

    def logprobs_asked(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_asked(self) -> int | None:
        # Echoed text reports its prompt's tokens too, with as many alternatives (vLLM's rule).
        return self.logprobs if self.echo else None

    def unsupported(self) -> None:
        super().unsupported()
        if self.suffix:
            raise BadRequest("suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise BadRequest("best_of must be 1", "best_of")


class Echo:
    """vLLM's `echo` for completions: each choice's text starts with its prompt (choice i answers
    prompt i // n), and its logprobs, when asked for, with the prompt's tokens'; streamed, the
    prompt comes with the choice's first piece. With `generates` False (max_tokens 0) the choice is
    the prompt alone. Not an answer's part: the cache stores answers without it."""

    def __init__(self, prompts: list[str | None] | None, n: int, generates: bool = True) -> None:
        # prompts None: no echo; a prompt None: token ids, echoed as the text reported beside the
        # answer (`prompt_text`, what the predictor decoded them to).
        self.prompts, self.n = prompts, n
        self.generates = generates
        self._echoed: set[int] = set()

    def whole(self, index: int, text: str, prompt_text: str | None = None) -> str:
        if self.prompts is None:
            return text
        prompt = self.prompts[index // self.n]
        return (prompt if prompt is not None else prompt_text or "") + (text if self.generates else "")

    def logprobs(self, prompt: Logprobs | None, generated: Logprobs | None) -> Logprobs | None:
        """A whole choice's logprobs: the prompt's (when echoed) then the generated tokens'."""
        if self.prompts is None or prompt is None:
            return generated
        return prompt + (generated or ()) if self.generates else prompt

    def piece(self, index: int, text: str, prompt_text: str | None = None) -> str:
        if self.prompts is None:
            return text
        if index in self._echoed:
            return text if self.generates else ""
        self._echoed.add(index)
        return self.whole(index, text, prompt_text)

    def piece_logprobs(
        self, index: int, prompt: Logprobs | None, generated: Logprobs | None
    ) -> Logprobs | None:
        """A piece's logprobs, called before `piece` for the same piece: the prompt's ride with
        the choice's first."""
        if self.prompts is None:
            return generated
        if index in self._echoed:
            return generated if self.generates else None
        return self.logprobs(prompt, generated)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's calls, earlier in the chat
    tool_call_id: str | None = None  # a tool's result: the call it answers

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # Said here, or pydantic's union error reads "Input should be a valid string" for an image.
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"part {i} has type {kind!r}: this model takes text only (type 'text')")
        return value

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatPrompt(EncodableRequest):
    """What shapes a chat prompt: the messages and the fields that the model's chat template takes.
    The OpenAI chat route reads it from the request; v2 clients send it as the JSON of the `chat`
    input (semserve/v2/text_contract.py), so that the predictor applies the chat template either way."""

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # Passed to the tokenizer's apply_chat_template, as vLLM's server does.
    chat_template_kwargs: dict[str, Any] | None = None

    def check(self) -> None:
        self.constraint()  # a 400 for a response_format or tool_choice it cannot constrain to
        for i, m in enumerate(self.messages):
            if "\x00" in m.text:
                raise BadRequest(f"messages[{i}].content contains a NUL character", "messages")
            if not _utf8(m.text) or not _utf8(m.name or ""):
                raise BadRequest(f"messages[{i}] is not valid UTF-8 (lone surrogate)", "messages")
        if self.messages[-1].role == "assistant":
            raise BadRequest("the last message must not be from the assistant", "messages")
        for key in (self.chat_template_kwargs or {}):
            if key in _TEMPLATE_ARGUMENTS_OF_OURS:
                raise BadRequest(f"chat_template_kwargs may not set {key!r}", "chat_template_kwargs")

    def tool_use(self) -> ToolUse | None:
        """The call `tools` and `tool_choice` force, if any (semserve/openai_tools.py)."""
        return tool_use(self.tools, self.tool_choice, self.parallel_tool_calls)

    def constraint(self) -> tuple[str, dict[str, Any]] | None:
        """The structured-outputs constraint the chat itself asks for, with the field that asks:
        its `response_format`, or the call its `tool_choice` forces; both is a 400."""
        use = self.tool_use()
        asked = [(name, c) for name, c in (("response_format", structured_of(self.response_format)),
                                            ("tool_choice", use.constraint if use else None))
                 if c is not None]  # fmt: skip
        if len(asked) > 1:
            message = "response_format and tool_choice both constrain the output: set one"
            raise BadRequest(message, "tool_choice")
        return asked[0] if asked else None

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (vLLM passes them so too)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def plain_messages(self) -> list[dict[str, Any]]:
        return [_plain(m) for m in self.messages]

    def context(self) -> dict[str, Any]:
        """Everything but the last message's text: what a cached answer must match exactly."""
        messages = self.plain_messages()
        context: dict[str, Any] = {
            "history": messages[:-1],
            "last_role": messages[-1]["role"],
            "tools": self.template_tools(),
            "response_format": self.response_format,
        }
        # Keyed only when set, so that the keys of chats without them stay as they were.
        if self.tool_choice is not None:
            choice = self.tool_choice
            context["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
        if self.parallel_tool_calls is not None:
            context["parallel_tool_calls"] = self.parallel_tool_calls
        if self.chat_template_kwargs:
            context["chat_template_kwargs"] = self.chat_template_kwargs
        return context

    @property
    def last_text(self) -> str:
        return self.messages[-1].text


# Arguments the server sets itself when it renders a template.
_TEMPLATE_ARGUMENTS_OF_OURS = ("conversation", "messages", "tokenize", "add_generation_prompt", "tools")


def _plain(m: ChatMessage) -> dict[str, Any]:
    """A message as chat templates take it."""
    # Chat templates expect "system"; "developer" is OpenAI's newer name for the same role.
    plain: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
    # Tool fields only where they are, so that other messages render (and key) as they did.
    if m.tool_calls:
        # Templates read the arguments as an object, as vLLM hands them over.
        plain["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                      "arguments": _arguments(c.function.arguments)}}
            for c in m.tool_calls
        ]  # fmt: skip
    if m.tool_call_id is not None:
        plain["tool_call_id"] = m.tool_call_id
    return plain


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, json_schema_extra={"minimum": 1})
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, json_schema_extra={"minimum": 0, "maximum": MAX_LOGPROBS})

    def logprobs_asked(self) -> int | None:
        if self.logprobs:
            return self.top_logprobs or 0
        if self.top_logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        return None

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> None:
        super().unsupported()
        self.prompt().check()

    def prompt(self) -> ChatPrompt:
        return ChatPrompt(
            messages=self.messages,
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=self.response_format,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def _chat_constraint(self) -> tuple[str, dict[str, Any]] | None:
        return self.prompt().constraint()


def _utf8(text: str) -> bool:
    """False for strings JSON can carry but UTF-8 cannot (lone surrogates like "\ud800"), which
    tokenizers reject with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validation_error(exc: ValidationError) -> BadRequest:
    """The first pydantic error, as one sentence naming the field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, str) or p not in ("str",))
    field_name = str(err["loc"][0]) if err.get("loc") else None
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    return BadRequest(f"{loc}: {msg}" if loc else msg, field_name)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def completion(
    rid: str,
    model: str,
    created: int,
    texts: list[str],
    finish_reasons: list[str],
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[CompletionLogprobs | None] | None = None,
) -> Completion:
    reported = logprobs or [None] * len(texts)
    return Completion(
        id=rid,
        object="text_completion",
        created=created,
        model=model,
        choices=[
            CompletionChoice(index=i, text=t, finish_reason=_finish(f), logprobs=lp)
            for i, (t, f, lp) in enumerate(zip(texts, finish_reasons, reported, strict=True))
        ],
        usage=usage(prompt_tokens, completion_tokens),
    )


def completion_chunk(
    rid: str, model: str, created: int, index: int, text: str, finish_reason: str | None,
    usage_so_far: CompletionUsage | None = None, logprobs: CompletionLogprobs | None = None,
) -> Completion:
    # Streaming completions reuse the Completion type; finish_reason is null until the last piece,
    # which the pydantic type allows only through model_construct.
    choice = CompletionChoice.model_construct(
        index=index, text=text, finish_reason=_finish(finish_reason) if finish_reason else None,
        logprobs=logprobs,
    )
    return Completion.model_construct(
        id=rid, object="text_completion", created=created, model=model, choices=[choice],
        usage=usage_so_far,  # null but with continuous usage (vLLM's continuous_usage_stats)
    )


def completion_usage_chunk(
    rid: str, model: str, created: int, prompt_tokens: int, completion_tokens: int
) -> Completion:
    return Completion.model_construct(
        id=rid, object="text_completion", created=created, model=model, choices=[],
        usage=usage(prompt_tokens, completion_tokens),
    )


def chat_completion(
    rid: str, model: str, created: int, texts: list[str], finish_reasons: list[str], prompt_tokens: int,
    completion_tokens: int, logprobs: list[ChoiceLogprobs | None] | None = None,
    calls: list[list[ToolCall]] | None = None,
) -> ChatCompletion:
    """One choice per text (OpenAI's `n`); usage counts the prompt once and every choice's tokens.
    A choice that calls tools (`calls`) has them in its message instead of content."""
    reported = logprobs or [None] * len(texts)
    called = calls or [[]] * len(texts)
    return ChatCompletion(
        id=rid,
        object="chat.completion",
        created=created,
        model=model,
        choices=[
            ChatChoice(index=i, message=_message(text, made), finish_reason=_finish(reason), logprobs=lp)
            for i, (text, reason, lp, made)
            in enumerate(zip(texts, finish_reasons, reported, called, strict=True))
        ],
        usage=usage(prompt_tokens, completion_tokens),
    )


def _message(text: str, calls: list[ToolCall]) -> ChatCompletionMessage:
    if not calls:
        return ChatCompletionMessage(role="assistant", content=text)
    return ChatCompletionMessage(role="assistant", content=None, tool_calls=[
        ChatCompletionMessageFunctionToolCall(id=new_call_id(), type="function",
                                              function=Function(name=c.name, arguments=c.arguments))
        for c in calls
    ])  # fmt: skip


def tool_call_deltas(calls: list[ToolCall]) -> list[ChoiceDeltaToolCall]:
    """Whole calls, as one chunk's delta carries them."""
    return [ChoiceDeltaToolCall(index=i, id=new_call_id(), type="function",
                                function=ChoiceDeltaToolCallFunction(name=c.name, arguments=c.arguments))
            for i, c in enumerate(calls)]  # fmt: skip


def arguments_delta(text: str, name: str | None = None) -> list[ChoiceDeltaToolCall]:
    """A piece of one call's arguments; its first piece (`name` given) opens the call."""
    if name is None:
        return [ChoiceDeltaToolCall(index=0, function=ChoiceDeltaToolCallFunction(arguments=text))]
    return [ChoiceDeltaToolCall(index=0, id=new_call_id(), type="function",
                                function=ChoiceDeltaToolCallFunction(name=name, arguments=text))]  # fmt: skip


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    content: str | None,
    finish_reason: str | None = None,
    role: bool = False,
    usage_so_far: CompletionUsage | None = None,
    with_usage: bool = False,
    index: int = 0,
    logprobs: ChoiceLogprobs | None = None,
    tool_calls: list[ChoiceDeltaToolCall] | None = None,
) -> ChatCompletionChunk:
    delta = ChoiceDelta(role="assistant" if role else None, content=content, tool_calls=tool_calls)
    # `with_usage` (the request's include_usage): the field is set, null but on the last chunk
    # unless usage is continuous, as OpenAI documents it; left out otherwise.
    usage_field = {"usage": usage_so_far} if with_usage else {}
    return ChatCompletionChunk(
        id=rid,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[
            ChunkChoice(
                index=index, delta=delta, finish_reason=_finish(finish_reason) if finish_reason else None,
                logprobs=logprobs,
            )
        ],
        **usage_field,
    )


def chat_usage_chunk(
    rid: str, model: str, created: int, prompt_tokens: int, completion_tokens: int
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=rid,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[],
        usage=usage(prompt_tokens, completion_tokens),
    )


# What JSON can carry of a logprob of -inf, as vLLM clamps it.
_LOWEST_LOGPROB = -9999.0


def _logprob(value: float) -> float:
    return max(value, _LOWEST_LOGPROB)


def _maybe_logprob(value: float | None) -> float | None:
    return None if value is None else _logprob(value)


def chat_logprobs(logprobs: Logprobs) -> ChoiceLogprobs:
    """Tokens' logprobs as a chat choice (or chunk) reports them."""

    def top(token: str, logprob: float) -> TopLogprob:
        return TopLogprob(token=token, bytes=list(token.encode()), logprob=_logprob(logprob))

    return ChoiceLogprobs(content=[
        ChatCompletionTokenLogprob(**top(t.token, t.logprob).model_dump(),
                                   top_logprobs=[top(a, lp) for a, lp in t.top])
        for t in logprobs
    ])  # fmt: skip


def completion_logprobs(logprobs: Logprobs, offset: int = 0) -> CompletionLogprobs:
    """Tokens' logprobs as a completion choice (or chunk) reports them; `offset`: where the first
    token starts in the choice's text."""
    offsets = []
    for t in logprobs:
        offsets.append(offset)
        offset += len(t.token)
    return CompletionLogprobs(
        text_offset=offsets,
        token_logprobs=[_maybe_logprob(t.logprob) for t in logprobs],
        tokens=[t.token for t in logprobs],
        # A prompt's first token has neither (vLLM reports null for both).
        top_logprobs=[None if t.logprob is None else {a: _logprob(lp) for a, lp in t.top} for t in logprobs],
    )


class LogprobsReport:
    """The logprobs of a response's choices as its route reports them (None: not asked for): a
    chat's, or a completion's, whose text offsets run on over a choice's pieces."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self._offsets: dict[int, int] = {}

    def of(self, index: int, logprobs: Logprobs | None) -> Any:
        if logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(logprobs)
        at = self._offsets.get(index, 0)
        self._offsets[index] = at + sum(len(t.token) for t in logprobs)
        return completion_logprobs(logprobs, at)


def model_card(name: str, created: int, owned_by: str = "semserve") -> OpenAIModelCard:
    return OpenAIModelCard(id=name, object="model", created=created, owned_by=owned_by)


def _finish(reason: str | None) -> Any:
    # vLLM reports "abort" for cancelled requests; those never reach a client as a success.
    return reason if reason in ("stop", "length", "tool_calls") else "stop"


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
