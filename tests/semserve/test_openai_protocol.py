"""semserve.openai_protocol: OpenAI requests as the services take them, here the ways to ask for a
constrained output (vLLM's structured_outputs, its older guided_* fields, OpenAI's response_format)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from semserve import openai_protocol as oa
from semserve.errors import BadRequest

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def constraint(**fields: Any) -> Any:
    body = {"model": "llm", "messages": [{"role": "user", "content": "x"}], **fields}
    req = oa.ChatCompletionRequest.model_validate(body)
    req.unsupported()
    so = req.sampling(16).structured_outputs
    return None if so is None else json.loads(so)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}},
         {"json": SCHEMA}),
        ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
        ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
        ({"guided_json": SCHEMA}, {"json": SCHEMA}),
    ],
)
def test_every_way_to_ask_maps_to_one_constraint(fields: dict[str, Any], expected: Any) -> None:
    assert constraint(**fields) == expected


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"response_format": {"type": "xml"}}, "response_format",
         "response_format type 'xml' is not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "c"}}}, "response_format",
         "json_schema needs json_schema.schema"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format",
         "guided_* and response_format both constrain the output"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "guided_*", "set one"),
    ],
)
def test_asking_twice_or_for_nothing_known_is_a_400(fields: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as caught:
        constraint(**fields)
    assert caught.value.field == field


@pytest.mark.parametrize(("prompt", "expected"), [
    ("Hi", ["Hi"]),
    (["Hi", "Yo"], ["Hi", "Yo"]),
    ([1, 2, 3], [oa.TokenPrompt((1, 2, 3))]),  # vLLM's token prompt: one prompt
    ([[1, 2], [3]], [oa.TokenPrompt((1, 2)), oa.TokenPrompt((3,))]),  # a batch of them
])  # fmt: skip
def test_a_completion_prompt_is_text_or_token_ids(prompt: Any, expected: list[Any]) -> None:
    assert oa.CompletionRequest.model_validate({"model": "llm", "prompt": prompt}).prompts == expected


@pytest.mark.parametrize(("prompt", "message"), [
    ([True], "prompt must be a string, a list of strings, a list of token ids"),  # a bool is no id
    ([[1], "x"], "a list of such lists"),
    ([1.5], "token ids (integers)"),
    ([[]], "prompt must not be an empty list of token ids"),
    ([-1], "prompt token ids must be in [0, 2147483648)"),
    ([[1, 2**31]], "prompt token ids must be in [0, 2147483648)"),
])  # fmt: skip
def test_a_prompt_that_is_neither_is_named(prompt: Any, message: str) -> None:
    with pytest.raises(Exception) as caught:
        oa.CompletionRequest.model_validate({"model": "llm", "prompt": prompt})
    error = oa.validation_error(caught.value)
    assert error.field == "prompt" and message in error.message, error.message


def test_token_prompts_echo_the_text_the_predictor_reports() -> None:
    req = oa.CompletionRequest.model_validate({"model": "llm", "prompt": [[1, 2], [3]], "echo": True})
    echo = req.echoes()
    assert echo.prompts == [None, None]
    assert echo.whole(1, " there", prompt_text="Hi") == "Hi there"
    assert echo.piece(0, " a", prompt_text="Yo") == "Yo a" and echo.piece(0, " b", prompt_text="Yo") == " b"
