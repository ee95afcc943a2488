"""semserve/responses_wire.py's models are openai's `openai.types.responses` types, field for field
(the fields we send, in openai's order, required where openai's are), and what the Responses builders
of semserve/openai_responses.py write, whole and streamed, the openai package reads back as its own
types with the same content."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai.types import responses as theirs
from pydantic import BaseModel, TypeAdapter

from semserve import openai_protocol as oa
from semserve import responses_wire
from semserve.openai_responses import ResponseEvents, ResponseShape, ResponsesRequest, response_of
from semserve.openai_tools import ToolCall

THEIRS: dict[str, type[BaseModel]] = {
    "ResponseOutputText": theirs.ResponseOutputText,
    "ResponseOutputMessage": theirs.ResponseOutputMessage,
    "ResponseFunctionToolCall": theirs.ResponseFunctionToolCall,
    "ResponseUsage": theirs.ResponseUsage,
    "InputTokensDetails": theirs.response_usage.InputTokensDetails,
    "OutputTokensDetails": theirs.response_usage.OutputTokensDetails,
    "Response": theirs.Response,
    "ResponseTextDeltaEvent": theirs.ResponseTextDeltaEvent,
    "ResponseTextDoneEvent": theirs.ResponseTextDoneEvent,
    "ResponseFunctionCallArgumentsDeltaEvent": theirs.ResponseFunctionCallArgumentsDeltaEvent,
    "ResponseFunctionCallArgumentsDoneEvent": theirs.ResponseFunctionCallArgumentsDoneEvent,
    "ResponseErrorEvent": theirs.ResponseErrorEvent,
    # Ours stands for two or more of theirs, one per event type.
    "ResponseLifecycleEvent": theirs.ResponseCompletedEvent,
    "ResponseOutputItemEvent": theirs.ResponseOutputItemAddedEvent,
    "ResponseContentPartEvent": theirs.ResponseContentPartAddedEvent,
}
EVENTS = TypeAdapter(theirs.ResponseStreamEvent)


@pytest.mark.parametrize("name", list(THEIRS))
def test_every_wire_model_has_openais_fields_in_openais_order(name: str) -> None:
    ours, their_fields = getattr(responses_wire, name).model_fields, THEIRS[name].model_fields
    assert set(ours) <= set(their_fields), set(ours) - set(their_fields)
    assert list(ours) == [f for f in their_fields if f in ours]
    for field, info in their_fields.items():
        if info.is_required():
            assert field in ours and ours[field].is_required(), (name, field)


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "llm", "input": "Hi", **fields})


async def _events(req: ResponsesRequest, chunks: list[Any]) -> list[BaseModel]:
    async def stream() -> AsyncIterator[Any]:
        for chunk in chunks:
            yield chunk

    return [e async for e in ResponseEvents(ResponseShape(req)).events(stream())]


def _read_back(events: list[BaseModel]) -> list[Any]:
    """openai's types parse every event, numbered 0, 1, 2, ... in order."""
    parsed = [EVENTS.validate_json(e.model_dump_json(exclude_unset=True)) for e in events]
    assert [p.sequence_number for p in parsed] == list(range(len(parsed)))
    return parsed


def test_a_whole_answer_reads_as_openais_response() -> None:
    req = _request(instructions="Be brief.", metadata={"k": "v"}, max_output_tokens=9)
    ours = response_of(ResponseShape(req), oa.chat_completion("chat-1", "llm", 17, ["Paris"], ["stop"], 5, 1))
    parsed = theirs.Response.model_validate_json(ours.model_dump_json(exclude_unset=True))
    assert parsed.output_text == "Paris" and parsed.status == "completed"
    assert parsed.usage is not None and (parsed.usage.input_tokens, parsed.usage.output_tokens) == (5, 1)
    assert (parsed.instructions, parsed.metadata, parsed.max_output_tokens) == ("Be brief.", {"k": "v"}, 9)
    assert parsed.id.startswith("resp_") and parsed.output[0].id.startswith("msg_")


def test_a_cut_answer_is_incomplete_for_max_output_tokens() -> None:
    chat = oa.chat_completion("c", "llm", 17, ["Pa"], ["length"], 5, 1)
    ours = response_of(ResponseShape(_request()), chat)
    parsed = theirs.Response.model_validate_json(ours.model_dump_json(exclude_unset=True))
    assert parsed.status == "incomplete" and parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"


def test_tool_calls_are_function_call_items() -> None:
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    req = _request(tools=tools, tool_choice="required")
    chat = oa.chat_completion("c", "llm", 17, ["[...]"], ["tool_calls"], 5, 9,
                              calls=[[ToolCall("f", '{"a": 1}'), ToolCall("f", "{}")]])  # fmt: skip
    parsed = theirs.Response.model_validate_json(response_of(ResponseShape(req), chat).model_dump_json())
    calls = [item for item in parsed.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"a": 1}'), ("f", "{}")]
    assert all(c.call_id.startswith("chatcmpl-tool-") for c in calls)
    assert parsed.tool_choice == "required" and parsed.tools[0].name == "f"


def test_a_streamed_answer_reads_as_openais_events() -> None:
    chunks = [oa.chat_chunk("c", "llm", 17, "", role=True), oa.chat_chunk("c", "llm", 17, "Pa"),
              oa.chat_chunk("c", "llm", 17, "ris"), oa.chat_chunk("c", "llm", 17, None, "stop"),
              oa.chat_usage_chunk("c", "llm", 17, 5, 2)]  # fmt: skip
    parsed = _read_back(asyncio.run(_events(_request(stream=True), chunks)))
    assert [p.type for p in parsed] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert parsed[0].response.status == "in_progress" and parsed[0].response.output == []
    assert [p.delta for p in parsed if p.type == "response.output_text.delta"] == ["Pa", "ris"]
    assert parsed[6].text == "Paris" and parsed[8].item.status == "completed"
    final = parsed[-1].response
    assert final.output_text == "Paris" and final.usage.output_tokens == 2
    assert {p.response.id for p in parsed if hasattr(p, "response")} == {final.id}


def test_a_streamed_named_call_opens_then_writes_its_arguments() -> None:
    tools = [{"type": "function", "name": "f"}]
    chunks = [oa.chat_chunk("c", "llm", 17, None, tool_calls=oa.arguments_delta('{"a"', "f")),
              oa.chat_chunk("c", "llm", 17, None, tool_calls=oa.arguments_delta(": 1}")),
              oa.chat_chunk("c", "llm", 17, None, "stop")]  # fmt: skip
    req = _request(stream=True, tools=tools, tool_choice={"type": "function", "name": "f"})
    parsed = _read_back(asyncio.run(_events(req, chunks)))
    kinds = [p.type for p in parsed]
    assert kinds[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.delta", "response.function_call_arguments.done",
                         "response.output_item.done", "response.completed"]  # fmt: skip
    assert parsed[2].item.name == "f" and parsed[2].item.arguments == ""
    assert parsed[5].arguments == '{"a": 1}'
    [call] = parsed[-1].response.output
    assert (call.type, call.name, call.arguments) == ("function_call", "f", '{"a": 1}')
    assert call.status == "completed"


def test_a_stream_cut_short_ends_incomplete() -> None:
    chunks = [oa.chat_chunk("c", "llm", 17, "Pa"), oa.chat_chunk("c", "llm", 17, None, "length")]
    parsed = _read_back(asyncio.run(_events(_request(stream=True), chunks)))
    assert parsed[-1].type == "response.incomplete"
    assert parsed[-1].response.incomplete_details.reason == "max_output_tokens"
    assert parsed[-2].item.status == "incomplete"


def test_an_empty_answer_is_an_empty_message() -> None:
    finish = oa.chat_chunk("c", "llm", 17, None, "stop")
    parsed = _read_back(asyncio.run(_events(_request(stream=True), [finish])))
    assert parsed[-1].response.output_text == ""
    assert [p.type for p in parsed].count("response.output_item.done") == 1


def test_an_error_midway_is_an_error_event_then_failed() -> None:
    from semserve.errors import Unavailable

    async def failing() -> list[BaseModel]:
        async def stream() -> AsyncIterator[Any]:
            yield oa.chat_chunk("c", "llm", 17, "Pa")
            raise Unavailable("the predictor went away")

        return [e async for e in ResponseEvents(ResponseShape(_request(stream=True))).events(stream())]

    parsed = _read_back(asyncio.run(failing()))
    error, failed = parsed[-2:]
    assert (error.type, error.code, error.message) == ("error", "server_error", "the predictor went away")
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error.message == "the predictor went away"
