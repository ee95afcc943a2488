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
