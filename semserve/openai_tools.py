"""OpenAI function calling (`tools`, `tool_choice`, `parallel_tool_calls`) as vLLM's server does it
without a tool-call parser: a forced call is generated under a JSON-schema constraint, so the text
the engine writes *is* the call, and both services turn that text into `tool_calls`.

- `tool_choice` a named function: the text is that function's arguments (its `parameters` schema);
- `tool_choice` "required": the text is a JSON list of `{"name", "parameters"}`, one or more calls
  (at most one with `parallel_tool_calls: false`), and the choice finishes with "tool_calls";
- "none": the tools only reach the chat template; the answer is text;
- "auto" (the default when tools are given) needs a parser of the model's own tool-call format,
  which SmolLM2's chat template has none of: a 400 saying what to ask instead, as vLLM answers it
  without --enable-auto-tool-choice.

The cache stores the generated text, keyed by the constraint, so a hit makes the same calls.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from semserve.errors import BadRequest

# OpenAI's rule for function names.
_NAME = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (an object)
    strict: bool | None = None


class ToolSpec(BaseModel):
    """One entry of `tools`: a function the model may call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: call this function."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    name: str
    arguments: str  # JSON, as the model wrote it


class ToolCallMessage(BaseModel):
    """A call in an earlier assistant message (a conversation's history)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: a function's name and its arguments as JSON."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolUse:
    """A forced call: `function` named, or any of the tools (None: "required"). `constraint` is
    the structured-outputs constraint the generation runs under."""

    function: str | None
    constraint: dict[str, Any]

    @property
    def required(self) -> bool:
        return self.function is None

    def calls(self, text: str) -> list[ToolCall]:
        """The calls a finished generation makes; [] when it is not one (cut short by max_tokens,
        say), and the text is then answered as content."""
        if self.function is not None:
            return [ToolCall(self.function, text)] if text.strip() else []
        try:
            written = json.loads(text)
        except json.JSONDecodeError:
            return []
        if not isinstance(written, list):
            return []
        calls = []
        for call in written:
            if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "parameters" in call):
                return []
            calls.append(ToolCall(call["name"], json.dumps(call["parameters"], ensure_ascii=False)))
        return calls

    def finish_reason(self, reason: str | None, calls: list[ToolCall]) -> str | None:
        # OpenAI's: "tool_calls" when the model chose to call ("required"); a named call, which the
        # client forced, finishes "stop" (vLLM's reading as well).
        if self.required and calls and reason == "stop":
            return "tool_calls"
        return reason


def tool_use(
    tools: list[ToolSpec] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolUse | None:
    """What `tools` and `tool_choice` ask of the answer: a forced call, or None (plain text); a 400
    for a choice this server cannot make."""
    if choice is not None and choice != "none" and not tools:
        raise BadRequest("tool_choice needs tools", "tool_choice")
    if not tools or choice == "none":
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise BadRequest("tools name a function twice", "tools")
    if choice is None or choice == "auto":
        raise BadRequest(
            'tool_choice "auto" (the default with tools) needs a parser of the model\'s own tool-call '
            'format, which this model has none of: set tool_choice to "required", "none" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    by_name = {t.function.name: t.function for t in tools}
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in by_name:
            message = f"tool_choice names {choice.function.name!r}, which is not in tools"
            raise BadRequest(message, "tool_choice")
        function = by_name[choice.function.name]
        return ToolUse(function.name, {"json": _arguments_schema(function)})
    # Each tool's arguments sit inside the list's schema, so their "$defs" (what "#/$defs/..."
    # references name) move to its root.
    defs: dict[str, Any] = {}
    options = []
    for f in by_name.values():
        arguments = dict(_arguments_schema(f))
        shared = arguments.pop("$defs", None) or {}
        if not isinstance(shared, dict):
            raise BadRequest(f"tools: the $defs of {f.name!r} must be an object", "tools")
        for name, schema in shared.items():
            if defs.setdefault(name, schema) != schema:
                raise BadRequest(f"tools define $defs {name!r} twice, differently", "tools")
        options.append({"properties": {"name": {"type": "string", "enum": [f.name]}, "parameters": arguments},
                        "required": ["name", "parameters"]})  # fmt: skip
    calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": options}}
    if parallel is False:
        calls["maxItems"] = 1
    if defs:
        calls["$defs"] = defs
    return ToolUse(None, {"json": calls})


def _arguments_schema(function: FunctionSpec) -> dict[str, Any]:
    # No parameters: the arguments are still a JSON object.
    return function.parameters or {"type": "object", "properties": {}}


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"
