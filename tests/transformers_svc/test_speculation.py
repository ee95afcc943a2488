"""Speculation for misses, streamed and unary (transformers_svc/answer_pipeline.py, --speculate):
transformers in front of the shared real predictor, a real Redis, OpenAI streams and v2 requests over
real sockets. A warm predictor's stream starts on the exact miss and is the miss's answer; a semantic
hit cancels it and nothing of it is stored; a predictor this transformer never heard from is not
woken by a hit; off means off. Unary requests speculate only with --speculate-unary."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Predictor, Transformer, start_transformer
from tests.support import metric_value

SPECULATIONS = "semserve_speculation_total"
CANCELLED_TOKENS = "semserve_speculation_cancelled_tokens_total"
PREDICTOR_CALLS = "semserve_transformer_predictor_calls_total"
GENERATIONS = "semserve_predictor_generations_total"
# A pair the verifier serves (tests/test_transformer_cache.py::test_paraphrase_is_a_semantic_hit).
STORED, PARAPHRASE = "How do I reset my password?", "How can I reset my password?"
# A speculation starts the predictor generating while the lookup's KNN runs, and here both share 2
# cores: the default 50 ms KNN budget can run out, and a lookup that fails open is a miss (as it
# should be, tests/cache/test_failopen.py), which is not what these tests are about.
LOOKUP_BUDGET = ("--cache-lookup-timeout-ms", "2000")


def metric(t: Transformer | Predictor, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{t.http}/metrics", timeout=10).text, name, **labels)


def chat(t: Transformer, content: str) -> tuple[str, str]:
    """A whole (unary) chat answer: (cache status, text)."""
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 24}  # fmt: skip
    r = httpx.post(f"{t.openai_base}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-semserve-cache"], r.json()["choices"][0]["message"]["content"]


def stream_chat(t: Transformer, content: str) -> tuple[str, str]:
    """A streamed chat answer (SSE): (cache status, text)."""
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 24, "stream": True}  # fmt: skip
    text = []
    with httpx.stream("POST", f"{t.openai_base}/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        status = r.headers["x-semserve-cache"]
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line.removeprefix("data: "))
                text.extend(c["delta"].get("content") or "" for c in chunk["choices"])
    return status, "".join(text)


def lookups(t: Transformer) -> dict[str, float]:
    """Lookups by result, for a failure's message."""
    results = ("exact", "semantic", "miss", "bypass", "error")
    return {r: metric(t, "semserve_cache_lookups_total", result=r) for r in results}


def speculations(t: Transformer) -> dict[str, float]:
    return {o: metric(t, SPECULATIONS, outcome=o) for o in ("used", "cancelled")}


@pytest.fixture(scope="module")
def deployment() -> str:
    return f"spec-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def warm(predictor: Predictor, redis_url: str, deployment: str) -> Iterator[Transformer]:
    t = start_transformer(
        deployment, predictor.grpc, redis_url, "--speculate-warm-window-s", "600", *LOOKUP_BUDGET
    )
    try:
        yield t
    finally:
        t.process.stop()


def test_a_warm_streamed_miss_streams_its_speculation(warm: Transformer, predictor: Predictor) -> None:
    chat(warm, f"Name a primary color. ({uuid.uuid4().hex[:6]})")  # the predictor has answered: warm
    before, generations = speculations(warm), metric(predictor, GENERATIONS)
    question = f"Name a large ocean. ({uuid.uuid4().hex[:6]})"
    status, text = stream_chat(warm, question)
    assert status == "miss" and text
    assert speculations(warm) == {"used": before["used"] + 1, "cancelled": before["cancelled"]}
    assert metric(predictor, GENERATIONS) == generations + 1  # the speculation was the one generation
    assert chat(warm, question) == ("exact", text)  # and its answer was stored


@pytest.fixture(scope="module")
def unary(predictor: Predictor, redis_url: str, deployment: str) -> Iterator[Transformer]:
    t = start_transformer(f"{deployment}-unary", predictor.grpc, redis_url, "--speculate-unary",
                          "--speculate-warm-window-s", "600", *LOOKUP_BUDGET)  # fmt: skip
    try:
        yield t
    finally:
        t.process.stop()


def test_unary_requests_do_not_speculate_by_default(warm: Transformer) -> None:
    assert chat(warm, f"Name a primary color. ({uuid.uuid4().hex[:6]})")[0] == "miss"  # warm
    before = speculations(warm)
    assert chat(warm, f"Name a large ocean. ({uuid.uuid4().hex[:6]})")[0] == "miss"
    assert speculations(warm) == before
    assert stream_chat(warm, f"Name a small planet. ({uuid.uuid4().hex[:6]})")[0] == "miss"
    assert speculations(warm) == {"used": before["used"] + 1, "cancelled": before["cancelled"]}


def test_a_warm_unary_miss_is_answered_by_its_speculation(unary: Transformer, predictor: Predictor) -> None:
    """With --speculate-unary, unary misses speculate too (the lookup runs beside the generation):
    OpenAI and v2 REST."""
    warm = unary
    chat(warm, f"Name a primary color. ({uuid.uuid4().hex[:6]})")  # warm
    before, generations = speculations(warm), metric(predictor, GENERATIONS)
    question = f"Name a large ocean. ({uuid.uuid4().hex[:6]})"
    status, text = chat(warm, question)
    assert status == "miss" and text, lookups(warm)
    assert speculations(warm) == {"used": before["used"] + 1, "cancelled": before["cancelled"]}
    assert metric(predictor, GENERATIONS) == generations + 1  # the speculation was the one generation
    assert chat(warm, question) == ("exact", text)  # its answer, whole, was stored
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "data": [f"The capital of Italy is ({uuid.uuid4().hex[:6]})"]}],
            "parameters": {"max_tokens": 8, "temperature": 0}}  # fmt: skip
    r = httpx.post(f"{warm.http}/v2/models/llm/infer", json=body, timeout=120)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs["cache_status"] == ["miss"], lookups(warm)
    assert outputs["finish_reason"][0] in ("stop", "length") and outputs["completion_tokens"][0] >= 1
    assert speculations(warm)["used"] == before["used"] + 2


def test_a_unary_semantic_hit_cancels_its_speculation(unary: Transformer) -> None:
    warm = unary
    status, stored = chat(warm, STORED)
    assert status in ("miss", "exact") and stored
    before = speculations(warm)
    assert chat(warm, PARAPHRASE) == ("semantic", stored), lookups(warm)
    assert speculations(warm) == {"used": before["used"], "cancelled": before["cancelled"] + 1}


def test_a_semantic_hit_cancels_the_speculation_and_stores_nothing(warm: Transformer) -> None:
    status, stored = chat(warm, STORED)
    assert status in ("miss", "exact") and stored
    before = speculations(warm)
    tokens = metric(warm, CANCELLED_TOKENS)
    status, text = stream_chat(warm, PARAPHRASE)
    assert (status, text) == ("semantic", stored), lookups(warm)
    assert speculations(warm) == {"used": before["used"], "cancelled": before["cancelled"] + 1}
    # What the cancelled stream had generated (0 if the hit came before its first token) is counted.
    assert f'{CANCELLED_TOKENS}{{model_name="llm"}}' in httpx.get(f"{warm.http}/metrics").text
    assert metric(warm, CANCELLED_TOKENS) >= tokens
    time.sleep(1.0)  # a store of the cancelled stream, were there one, would have happened by now
    # Nothing stored under the paraphrase's own key: it is still a semantic hit, not an exact one.
    assert chat(warm, PARAPHRASE) == ("semantic", stored)


def test_a_hit_never_wakes_a_predictor_this_transformer_has_not_heard_from(
    warm: Transformer, predictor: Predictor, redis_url: str, deployment: str
) -> None:
    assert chat(warm, STORED)[0] in ("miss", "exact")  # in the shared index
    fresh = start_transformer(f"{deployment}-cold", predictor.grpc, redis_url,
                              "--cache-deployment", deployment, *LOOKUP_BUDGET)  # fmt: skip
    try:
        status, text = stream_chat(fresh, PARAPHRASE)
        assert status == "semantic" and text, lookups(fresh)
        assert metric(fresh, PREDICTOR_CALLS) == 0
        assert speculations(fresh) == {"used": 0, "cancelled": 0}
    finally:
        fresh.process.stop()


def test_speculation_off_moves_no_speculation_metric(predictor: Predictor, redis_url: str) -> None:
    off = start_transformer(
        f"spec-off-{uuid.uuid4().hex[:6]}", predictor.grpc, redis_url, "--no-speculate", *LOOKUP_BUDGET
    )
    try:
        status, stored = chat(off, STORED)
        assert status == "miss"
        assert chat(off, f"Name a large ocean. ({uuid.uuid4().hex[:6]})")[0] == "miss"  # unary, warm by now
        assert stream_chat(off, f"Name a large ocean. ({uuid.uuid4().hex[:6]})")[0] == "miss"
        assert stream_chat(off, PARAPHRASE) == ("semantic", stored)
        assert speculations(off) == {"used": 0, "cancelled": 0}
        assert metric(off, CANCELLED_TOKENS) == 0
    finally:
        off.process.stop()

