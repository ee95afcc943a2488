"""OpenAI's Responses API through the transformer, in front of the real predictor and Redis: a
response is the chat it means, so it is cached as that chat, and a question asked through either API
is one entry (counted from the predictor's own metrics)."""

from __future__ import annotations

import json
import uuid

import httpx
import openai

from tests.conftest import Predictor, Transformer
from tests.support import metric_value

GENERATIONS = "semserve_predictor_generations_total"


def generations(p: Predictor) -> float:
    return metric_value(httpx.get(f"{p.http}/metrics").text, GENERATIONS)


def test_a_response_is_cached_as_its_chat(transformer: Transformer, predictor: Predictor) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    q = f"What is the capital of France? (ref {uuid.uuid4().hex[:6]})"
    ask = {"model": "llm", "input": q, "temperature": 0, "max_output_tokens": 24}
    before = generations(predictor)
    first = client.responses.with_raw_response.create(**ask)
    assert first.headers["x-semserve-cache"] == "miss"
    text = first.parse().output_text
    assert text
    again = client.responses.with_raw_response.create(**ask)
    assert again.headers["x-semserve-cache"] == "exact"
    assert again.parse().output_text == text and again.parse().id != first.parse().id
    # Streamed, the hit is replayed as the Responses events.
    streamed = client.responses.with_raw_response.create(**ask, stream=True)
    assert streamed.headers["x-semserve-cache"] == "exact"
    events = list(streamed.parse())
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert events[-1].type == "response.completed" and events[-1].response.output_text == text
    # The same conversation through chat completions is the same entry.
    chat = client.chat.completions.with_raw_response.create(
        model="llm", messages=[{"role": "user", "content": q}], temperature=0, max_completion_tokens=24)
    assert chat.headers["x-semserve-cache"] == "exact"
    assert chat.parse().choices[0].message.content == text
    assert generations(predictor) - before == 1


def test_logprobs_pass_through_and_bypass_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    ask = {"model": "llm", "input": f"What is the capital of France? (ref {uuid.uuid4().hex[:6]})",
           "temperature": 0, "max_output_tokens": 6, "include": ["message.output_text.logprobs"]}  # fmt: skip
    before = generations(predictor)
    raw = client.responses.with_raw_response.create(**ask)
    assert raw.headers["x-semserve-cache"] == "bypass" and generations(predictor) == before + 1
    [part] = raw.parse().output[0].content
    assert len(part.logprobs) == raw.parse().usage.output_tokens and part.logprobs[0].top_logprobs == []
    streamed = client.responses.with_raw_response.create(**ask, stream=True)
    assert streamed.headers["x-semserve-cache"] == "bypass"
    deltas = [t for e in streamed.parse() if e.type == "response.output_text.delta" for t in e.logprobs]
    assert len(deltas) == len(part.logprobs)


def test_a_forced_call_is_cached_and_made_again(transformer: Transformer, predictor: Predictor) -> None:
    weather = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}  # fmt: skip
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    ask = {"model": "llm", "input": f"What is the weather in Paris? (ref {uuid.uuid4().hex[:6]})",
           "tools": [weather], "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0,
           "max_output_tokens": 40}  # fmt: skip
    first = client.responses.with_raw_response.create(**ask)
    assert first.headers["x-semserve-cache"] == "miss"
    [call] = first.parse().output
    assert call.type == "function_call" and isinstance(json.loads(call.arguments)["city"], str)
    streamed = client.responses.with_raw_response.create(**ask, stream=True)
    assert streamed.headers["x-semserve-cache"] == "exact"
    [same] = list(streamed.parse())[-1].response.output
    assert (same.name, same.arguments) == (call.name, call.arguments) and same.call_id != call.call_id


def test_what_needs_a_store_is_a_400_or_404_through_the_transformer(transformer: Transformer) -> None:
    body = {"model": "llm", "input": "Hi", "previous_response_id": "resp_1"}
    r = httpx.post(f"{transformer.openai_base}/responses", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id", r.text
    stored = httpx.get(f"{transformer.openai_base}/responses/resp_1", timeout=60)
    assert stored.status_code == 404 and "stores no responses" in stored.json()["error"]["message"]
