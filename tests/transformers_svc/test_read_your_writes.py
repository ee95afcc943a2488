"""Read-your-writes across replicas (issue 25, item 4): two transformers on one Redis and one
predictor. 30 fresh prompts, each asked once through replica A (half of them streamed: v2 REST,
v2 generate and generate_stream, OpenAI chat and completions, streamed or not), then again
through replica B: every complete answer comes back `exact`, since the answer is stored (and the
lease released) before the response, or the stream's final chunk, goes out."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Predictor, Transformer, start_transformer

COMPLETE = ("stop", "length")
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def replicas(predictor: Predictor, redis_url: str) -> Iterator[tuple[Transformer, Transformer]]:
    deployment = f"ryw-{uuid.uuid4().hex[:8]}"
    started: list[Transformer] = []
    try:
        for name in ("a", "b"):
            # One deployment (one index) for both: the second flag wins over start_transformer's.
            started.append(start_transformer(f"ryw-{name}", predictor.grpc, redis_url,
                                             "--cache-deployment", deployment))  # fmt: skip
        yield started[0], started[1]
    finally:
        for t in started:
            t.process.stop()


def v2_infer(t: Transformer, prompt: str) -> tuple[str, str]:
    body = {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
        "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0},
    }
    r = httpx.post(f"{t.http}/v2/models/llm/infer", json=body, timeout=120)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    return outputs["cache_status"][0], outputs["finish_reason"][0]


def generate(t: Transformer, prompt: str) -> tuple[str, str]:
    body = {"text_input": prompt, "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
    r = httpx.post(f"{t.http}/v2/models/llm/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["cache_status"], r.json()["finish_reason"]


def generate_stream(t: Transformer, prompt: str) -> tuple[str, str]:
    body = {"text_input": prompt, "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
    events = []
    with httpx.stream("POST", f"{t.http}/v2/models/llm/generate_stream", json=body, timeout=120) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    statuses = {e["cache_status"] for e in events}
    assert len(statuses) == 1, events
    return statuses.pop(), events[-1]["finish_reason"]


def openai(t: Transformer, prompt: str, chat: bool, stream: bool) -> tuple[str, str]:
    body: dict[str, Any] = {"model": "llm", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    url = f"{t.openai_base}/{'chat/completions' if chat else 'completions'}"
    if not stream:
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.headers["x-semserve-cache"], r.json()["choices"][0]["finish_reason"]
    finish = ""
    with httpx.stream("POST", url, json=body, timeout=120) as s:
        assert s.status_code == 200
        status = s.headers["x-semserve-cache"]
        for line in s.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    finish = choice.get("finish_reason") or finish
    return status, finish


SUBJECTS = (
    "volcanoes", "penguins", "jazz music", "the Roman empire", "photosynthesis", "chess openings",
    "coffee roasting", "black holes", "the Nile river", "origami", "honeybees", "glaciers",
    "the printing press", "sushi", "lighthouses", "tornadoes", "violins", "the Moon landing",
    "coral reefs", "bicycles", "pyramids", "thunderstorms", "tulips", "submarines", "wolves",
    "the Olympic games", "bread baking", "satellites", "deserts", "knitting",
)
# Six ways to ask, three of them streamed: five asks each.
WAYS = {
    "v2 infer": v2_infer,
    "v2 generate": generate,
    "openai chat": lambda t, p: openai(t, p, chat=True, stream=False),
    "v2 generate_stream": generate_stream,
    "openai chat stream": lambda t, p: openai(t, p, chat=True, stream=True),
    "openai completions stream": lambda t, p: openai(t, p, chat=False, stream=True),
}


def test_a_complete_answer_is_exact_through_the_other_replica(
    replicas: tuple[Transformer, Transformer],
) -> None:
    a, b = replicas
    run = uuid.uuid4().hex[:8]
    ways = list(WAYS.items())
    # Thirty subjects far apart, so no prompt is a paraphrase of another (a semantic hit on A).
    prompts = [(f"Write one sentence about {subject} (run {run}):", *ways[i % len(ways)])
               for i, subject in enumerate(SUBJECTS)]  # fmt: skip
    complete, wrong = 0, []
    for prompt, way, ask in prompts:
        first, finish = ask(a, prompt)
        assert first == "miss", (way, first)
        if finish not in COMPLETE:
            continue  # only complete answers are cached
        complete += 1
        again, _ = ask(b, prompt)
        if again != "exact":
            wrong.append((way, again))
    assert complete >= 20, complete
    assert not wrong, (wrong, b.process.log_tail(60))
