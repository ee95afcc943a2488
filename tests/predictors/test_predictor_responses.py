"""OpenAI's Responses API (`/v1/responses`) against the real predictor, through the official
`openai` client: whole and streamed, instructions, history with function calls, forced calls,
JSON under a schema, and what it refuses."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import Predictor

INSTRUCTIONS = "You are a geography assistant. Answer in one short sentence."
QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}  # fmt: skip


@pytest.fixture
def client(predictor: Predictor) -> openai.OpenAI:
    return openai.OpenAI(base_url=predictor.openai_base, api_key="unused", max_retries=0)


def test_a_response_answers_as_the_chat_does(client: openai.OpenAI) -> None:
    resp = client.responses.create(model="llm", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                                   max_output_tokens=20, metadata={"ticket": "42"})  # fmt: skip
    assert resp.object == "response" and resp.status == "completed"
    assert "Paris" in resp.output_text
    assert resp.usage is not None and resp.usage.output_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert (resp.instructions, resp.metadata, resp.max_output_tokens) == (INSTRUCTIONS, {"ticket": "42"}, 20)
    # The same question through chat completions: the same text (one chat, asked two ways).
    chat = client.chat.completions.create(model="llm", temperature=0, max_tokens=20, messages=[
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}])  # fmt: skip
    assert chat.choices[0].message.content == resp.output_text


def test_a_streamed_response_comes_as_named_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="llm", instructions=INSTRUCTIONS, input=QUESTION,
                                          temperature=0, max_output_tokens=20, stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-1] == "response.completed" and "response.output_text.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert "Paris" in deltas and final.output_text == deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    # The openai client's stream helper reads the same events into the final response.
    with client.responses.stream(model="llm", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                                 max_output_tokens=20) as stream:  # fmt: skip
        assert stream.get_final_response().output_text == deltas


def test_a_cut_response_is_incomplete(client: openai.OpenAI) -> None:
    resp = client.responses.create(model="llm", input="Write a long story about a dragon.", temperature=0,
                                   max_output_tokens=3)  # fmt: skip
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3 and resp.output_text


def test_a_forced_call_then_its_output_in_the_next_input(client: openai.OpenAI) -> None:
    first = client.responses.create(model="llm", input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
                                    max_output_tokens=40)  # fmt: skip
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    # The caller runs the function and sends the whole conversation back (no stored responses).
    second = client.responses.create(model="llm", temperature=0, max_output_tokens=30, tools=[WEATHER],
                                     tool_choice="none", input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."},
    ])  # fmt: skip
    assert second.status == "completed" and second.output_text
    # "required" with one call at most, streamed: the call comes whole before the finish.
    events = list(client.responses.create(model="llm", input="What is the weather in Paris?", tools=[WEATHER],
                                          tool_choice="required", parallel_tool_calls=False, temperature=0,
                                          max_output_tokens=60, stream=True))  # fmt: skip
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    [made] = events[-1].response.output
    assert made.name == "get_weather" and made.arguments == done.arguments


def test_json_under_a_schema(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}  # fmt: skip
    shape = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    resp = client.responses.create(model="llm", input=QUESTION, temperature=0, max_output_tokens=30,
                                   text=shape)
    assert isinstance(json.loads(resp.output_text)["capital"], str)
    assert resp.text.format.type == "json_schema"


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stores none"),
    ({"tools": [WEATHER]}, "tool_choice", "needs a parser"),
    ({"tools": [{"type": "web_search"}]}, "tools", "functions only"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input", "text only"),
    ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({"model": "gpt-4o"}, "model", "gpt-4o"),
])  # fmt: skip
def test_what_it_cannot_do_is_a_400_naming_the_field(
    predictor: Predictor, body: dict, param: str, words: str
) -> None:
    sent = {"model": "llm", "input": QUESTION, "max_output_tokens": 4, **body}
    r = httpx.post(f"{predictor.openai_base}/responses", json=sent, timeout=60)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_logprobs_as_the_chat_reports_them(client: openai.OpenAI) -> None:
    # OpenAI's include "message.output_text.logprobs" with top_logprobs: each output token's logprob
    # on the output text, whole and on the stream's deltas, as the chat reports them.
    ask = {"model": "llm", "input": QUESTION, "temperature": 0, "max_output_tokens": 8,
           "include": ["message.output_text.logprobs"], "top_logprobs": 2}  # fmt: skip
    whole = client.responses.create(**ask)
    [part] = whole.output[0].content
    assert len(part.logprobs) == whole.usage.output_tokens
    assert "".join(t.token for t in part.logprobs) == part.text == whole.output_text
    assert all(t.bytes == list(t.token.encode()) and 1 <= len(t.top_logprobs) <= 2 for t in part.logprobs)
    assert all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.logprob for t in part.logprobs)
    events = list(client.responses.create(**ask, stream=True))
    deltas = [t.token for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert deltas == [t.token for t in part.logprobs]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert [t.token for t in done.logprobs] == deltas
    assert client.responses.create(**{**ask, "include": []}).output[0].content[0].logprobs is None


def test_the_document_lists_the_route(predictor: Predictor) -> None:
    paths = httpx.get(f"{predictor.http}/openapi.json", timeout=30).json()["paths"]
    body = paths["/openai/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "input", "instructions", "max_output_tokens", "tools", "text"} <= set(body["properties"])


def test_a_stored_response_is_not_found_and_says_why(client: openai.OpenAI) -> None:
    # Nothing is stored, so the client's retrieve and delete find nothing, with the reason.
    for call in (lambda: client.responses.retrieve("resp_1"), lambda: client.responses.delete("resp_1")):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert "stores no responses" in caught.value.message
