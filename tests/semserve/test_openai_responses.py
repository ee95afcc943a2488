"""A Responses request becomes the chat it means (semserve/openai_responses.py), and what it asks
that this server cannot do is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from semserve import openai_protocol as oa
from semserve.answer import TokenLogprob
from semserve.errors import BadRequest
from semserve.openai_protocol import validation_error
from semserve.openai_responses import ResponseEvents, ResponseShape, ResponsesRequest, response_of


def request(**fields: Any) -> ResponsesRequest:
    body = {"model": "llm", "input": "What is the capital of France?", **fields}
    return ResponsesRequest.model_validate(body)


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = request(instructions="Answer in one word.", max_output_tokens=7, temperature=0).chat_request()
    assert [(m.role, m.text) for m in chat.messages] == [
        ("system", "Answer in one word."), ("user", "What is the capital of France?")]
    assert (chat.effective_max_tokens(), chat.temperature, chat.stream) == (7, 0, False)


def test_items_are_messages_and_calls_their_tool_messages() -> None:
    items = [
        {"role": "user", "content": "Weather in Paris?"},  # EasyInputMessage: no type
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Shorter."}]},
    ]  # fmt: skip
    chat = request(input=items).chat_request()
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool", "assistant", "developer"]
    calls = chat.messages[1].tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_1", "weather", '{"city": "Paris"}'), ("call_2", "weather", '{"city": "Lyon"}')]
    assert [(m.tool_call_id, m.text) for m in chat.messages[2:4]] == [("call_1", "sunny"), ("call_2", "rain")]
    assert chat.messages[4].text == "Sunny and rain."


def test_function_tools_text_format_and_sampling_extensions_reach_the_chat() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    chat = request(
        tools=[{"type": "function", "name": "weather", "parameters": schema, "strict": True}],
        tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False, top_k=5, seed=3,
    ).chat_request()
    assert chat.tools is not None and chat.tools[0].function.name == "weather"
    assert chat.tools[0].function.parameters == schema
    assert chat.prompt().tool_use() is not None
    assert (chat.parallel_tool_calls, chat.top_k, chat.seed) == (False, 5, 3)

    shape = {"format": {"type": "json_schema", "name": "city", "schema": schema}}
    shaped = request(text=shape).chat_request()
    assert shaped.response_format == {"type": "json_schema",
                                      "json_schema": {"name": "city", "schema": schema, "strict": None}}
    assert shaped.structured() == {"json": schema}
    json_object = request(text={"format": {"type": "json_object"}}).chat_request()
    assert json_object.structured() == {"json_object": True}
    assert request(text={"format": {"type": "text"}, "verbosity": "low"}).chat_request().structured() is None


def test_a_stream_asks_for_usage() -> None:
    chat = request(stream=True).chat_request()
    assert chat.stream and chat.usage_report.final


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stores none"),
    ({"background": True}, "background", "send the whole conversation"),
    ({"conversation": "conv_1"}, "conversation", "stores none"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt", "stores none"),
    ({"include": ["message.output_text.logprobs", "reasoning.encrypted_content"]}, "include",
     "'reasoning.encrypted_content' is not supported (only 'message.output_text.logprobs')"),
    ({"top_logprobs": 21}, "top_logprobs", "top_logprobs must be in [0, 20], got 21"),
    ({"truncation": "auto"}, "truncation", "past the context"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "does not reason"),
    ({"input": "a\x00b"}, "input", "NUL"),
    ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
])  # fmt: skip
def test_what_needs_a_store_or_a_capability_is_a_400(fields: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        request(**fields).unsupported()
    assert caught.value.field == field and words in caught.value.message


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"n": 2}, "n", "chat completions field"),
    ({"max_tokens": 5}, "max_tokens", "chat completions field"),
    ({"tools": [{"type": "function", "name": "f"}]}, "tool_choice", "auto"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "schema"),
    ({"input": [{"role": "assistant", "content": "Hi"}]}, "input", "assistant"),
])  # fmt: skip
def test_what_the_chat_refuses_names_the_responses_field(
    fields: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        request(**fields).chat_request()
    assert caught.value.field == field and words in caught.value.message, caught.value.message


@pytest.mark.parametrize(("fields", "words"), [
    ({"input": []}, "empty list"),
    ({"input": "  "}, "must not be empty"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "item 0 has type 'input_image'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "text only"),
    ({"tools": [{"type": "web_search"}]}, "functions only"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "item 0: function_call.call_id"),
])  # fmt: skip
def test_items_and_tools_this_server_has_no_use_for_are_named(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    # The first error is what the 400 says (validation_error).
    assert words in validation_error(caught.value).message


def test_logprobs_are_asked_by_the_include_as_the_chat_s() -> None:
    asked = request(include=["message.output_text.logprobs"], top_logprobs=3).chat_request()
    assert (asked.logprobs, asked.top_logprobs, asked.logprobs_asked()) == (True, 3, 3)
    assert request(include=["message.output_text.logprobs"]).chat_request().logprobs_asked() == 0
    # top_logprobs alone reports nothing, as in vLLM: the include asks for them.
    assert request(top_logprobs=3).chat_request().logprobs_asked() is None


def _chunk(text: str | None, logprobs: tuple[TokenLogprob, ...] = (), finish: str | None = None) -> Any:
    return oa.chat_chunk("c", "llm", 0, text, finish, False, None, False,
                         logprobs=oa.chat_logprobs(logprobs) if logprobs else None)  # fmt: skip


async def _events(req: ResponsesRequest, chunks: list[Any]) -> list[Any]:
    async def source() -> Any:
        for c in chunks:
            yield c

    return [e async for e in ResponseEvents(ResponseShape(req)).events(source())]


async def test_logprobs_ride_with_the_text_whole_and_streamed() -> None:
    paris = TokenLogprob(" Paris", -0.25, ((" Paris", -0.25), (" Lyon", -2.0)))
    half = TokenLogprob("\u00e9", -1.5)  # a token whose text is not whole yet: logprobs, no text
    req = request(include=["message.output_text.logprobs"], top_logprobs=2)
    whole = oa.chat_completion("c", "llm", 0, [" Paris"], ["stop"], 5, 1, [oa.chat_logprobs((paris,))],
                               [[]])  # fmt: skip
    [part] = response_of(ResponseShape(req), whole).output[0].content
    assert part.logprobs == [{"token": " Paris", "bytes": list(b" Paris"), "logprob": -0.25, "top_logprobs": [
        {"token": " Paris", "bytes": list(b" Paris"), "logprob": -0.25},
        {"token": " Lyon", "bytes": list(b" Lyon"), "logprob": -2.0}]}]  # fmt: skip
    assert response_of(ResponseShape(request()), whole).output[0].content[0].logprobs is None
    chunks = [_chunk(" Paris", (paris,)), _chunk("", (half,)), _chunk("\u00e9t\u00e9", (), "stop")]
    events = await _events(req, chunks)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [[t["token"] for t in d.logprobs] for d in deltas] == [[" Paris"], ["\u00e9"]]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert [t["token"] for t in done.logprobs] == [" Paris", "\u00e9"]
    final = events[-1].response.output[0].content[0]
    assert final.text == " Paris\u00e9t\u00e9"
    assert [t["token"] for t in final.logprobs] == [" Paris", "\u00e9"]
    # Not asked: none, and the deltas' lists stay empty (openai's type requires the field).
    plain = await _events(request(), [_chunk(" Paris", (paris,), "stop")])
    assert [e.logprobs for e in plain if e.type == "response.output_text.delta"] == [[]]
    assert plain[-1].response.output[0].content[0].logprobs is None
