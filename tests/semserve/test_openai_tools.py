"""Function calling's decisions (semserve/openai_tools.py): which constraint a tool_choice asks for,
which calls a generated text makes, and the 400s."""

from __future__ import annotations

import re

import pytest

from semserve.errors import BadRequest
from semserve.openai_tools import NamedToolChoice, ToolCall, ToolSpec, ToolUse, tool_use

WEATHER = ToolSpec.model_validate({"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"place": {"$ref": "#/$defs/place"}}, "required": ["place"],
    "$defs": {"place": {"type": "string"}}}}})  # fmt: skip
TIME = ToolSpec.model_validate({"type": "function", "function": {"name": "get_time"}})


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def test_a_named_call_is_generated_as_its_arguments() -> None:
    use = tool_use([WEATHER, TIME], named("get_time"), None)
    # No parameters: the arguments are still an object.
    assert use == ToolUse("get_time", {"json": {"type": "object", "properties": {}}})
    assert use.calls("{}") == [ToolCall("get_time", "{}")]
    assert use.calls("  ") == []  # nothing written (max_tokens ran out first): no call
    assert use.finish_reason("stop", use.calls("{}")) == "stop"  # forced by the client: "stop", as OpenAI's


def test_required_is_a_list_of_calls_with_the_defs_at_its_root() -> None:
    use = tool_use([WEATHER, TIME], "required", False)
    assert use is not None and use.required
    schema = use.constraint["json"]
    assert schema["minItems"] == 1 and schema["maxItems"] == 1  # parallel_tool_calls: false
    assert schema["$defs"] == {"place": {"type": "string"}}  # "#/$defs/place" resolves from the root
    [weather, _] = schema["items"]["anyOf"]
    assert weather["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert "$defs" not in weather["properties"]["parameters"]
    assert "maxItems" not in tool_use([WEATHER], "required", None).constraint["json"]
    calls = use.calls('[{"name": "get_weather", "parameters": {"place": "Paris"}}, {"name": "get_time", '
                      '"parameters": {}}]')  # fmt: skip
    assert calls == [ToolCall("get_weather", '{"place": "Paris"}'), ToolCall("get_time", "{}")]
    assert use.finish_reason("stop", calls) == "tool_calls"
    assert use.finish_reason("length", calls) == "length"


@pytest.mark.parametrize("text", ['[{"name": "get_time", "param', '{"name": "get_time", "parameters": {}}',
                                  '[{"name": 3, "parameters": {}}]', '[{"name": "get_time"}]',
                                  "[]"])  # fmt: skip
def test_text_that_is_no_list_of_calls_makes_none(text: str) -> None:
    use = tool_use([TIME], "required", None)
    assert use is not None and use.calls(text) == []
    assert use.finish_reason("stop", []) == "stop"


def test_no_tools_or_none_is_plain_text() -> None:
    assert tool_use(None, None, None) is None
    assert tool_use([WEATHER], "none", None) is None
    assert tool_use(None, "none", None) is None


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ([WEATHER], None, 'tool_choice "auto" (the default with tools) needs a parser'),
        ([WEATHER], "auto", "needs a parser"),
        (None, "required", "tool_choice needs tools"),
        ([], named("get_time"), "tool_choice needs tools"),
        ([WEATHER], named("get_time"), "tool_choice names 'get_time', which is not in tools"),
        ([TIME, TIME], "required", "tools name a function twice"),
    ],
)
def test_choices_it_cannot_make_are_400s(tools: list[ToolSpec] | None, choice: object, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        tool_use(tools, choice, None)  # type: ignore[arg-type]


def test_defs_of_one_name_that_differ_are_a_400() -> None:
    other = WEATHER.model_copy(deep=True)
    other.function.name = "get_rain"
    other.function.parameters["$defs"] = {"place": {"type": "integer"}}  # type: ignore[index]
    with pytest.raises(BadRequest, match="tools define \\$defs 'place' twice, differently"):
        tool_use([WEATHER, other], "required", None)
    broken = TIME.model_copy(deep=True)
    broken.function.parameters = {"type": "object", "$defs": ["no"]}
    with pytest.raises(BadRequest, match="the \\$defs of 'get_time' must be an object"):
        tool_use([broken], "required", None)
