"""The predictor labels each answer with its model revision; a transformer keyed by another revision
(the stable one during a canary, whose misses reach both predictor revisions) serves such an answer
but does not cache it. Real predictor (the shared one, --model-revision rev-a), real Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from kserve import InferResponse

from semserve import v2
from semserve.openai_routes import MODEL_REVISION_HEADER
from tests.conftest import PREDICTOR_REVISION, Predictor, Transformer, start_transformer
from tests.support import metric_value

SKIPPED = "semserve_cache_store_skipped_total"


def unique(text: str) -> str:
    return f"{text} (ref {uuid.uuid4().hex[:6]})"


def v2_body(prompt: str) -> dict[str, object]:
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": {"max_tokens": 8, "temperature": 0},
    }


def v2_call(t: Transformer, prompt: str) -> dict[str, list]:
    r = httpx.post(f"{t.http}/v2/models/llm/infer", json=v2_body(prompt), timeout=120)
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def chat(t: Transformer, content: str, stream: bool = False) -> tuple[str, str]:
    """(x-semserve-cache, answer text) of one chat completion, streamed or not."""
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 8, "stream": stream}
    url = f"{t.openai_base}/chat/completions"
    if not stream:
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.headers["x-semserve-cache"], r.json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200
        status, text = r.headers["x-semserve-cache"], ""
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or ""
    return status, text


def skipped(t: Transformer) -> float:
    return metric_value(httpx.get(f"{t.http}/metrics").text, SKIPPED, reason="revision_mismatch")


@pytest.fixture(scope="module")
def same_revision(predictor: Predictor, redis_url: str) -> Iterator[Transformer]:
    t = start_transformer("rev-same", predictor.grpc, redis_url,
                          "--expected-model-revision", PREDICTOR_REVISION)
    try:
        yield t
    finally:
        t.process.stop()


@pytest.fixture(scope="module")
def other_revision(predictor: Predictor, redis_url: str) -> Iterator[Transformer]:
    t = start_transformer("rev-other", predictor.grpc, redis_url,
                          "--expected-model-revision", "rev-b", "--log-level", "debug")
    try:
        yield t
    finally:
        t.process.stop()


def test_predictor_reports_its_revision(predictor: Predictor) -> None:
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=v2_body(unique("Say hi.")), timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["model_revision"] == PREDICTOR_REVISION
    assert v2.response_revision(InferResponse.from_rest(r.json())) == PREDICTOR_REVISION
    body = {"model": "llm", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{predictor.openai_base}/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.headers[MODEL_REVISION_HEADER] == PREDICTOR_REVISION
    with httpx.stream("POST", f"{predictor.openai_base}/completions", json={**body, "stream": True},
                      timeout=120) as s:
        assert s.status_code == 200 and s.headers[MODEL_REVISION_HEADER] == PREDICTOR_REVISION
        s.read()


def test_grpc_revision_parameter_is_read() -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    response = pb.ModelInferResponse(model_name="llm", id="x")
    response.parameters["model_revision"].string_param = "rev-z"
    assert v2.response_revision(InferResponse.from_grpc(response)) == "rev-z"
    assert v2.response_revision(InferResponse.from_grpc(pb.ModelInferResponse(model_name="llm"))) is None


def test_same_revision_is_cached(same_revision: Transformer) -> None:
    prompt = unique("Name a fruit.")
    first, second = v2_call(same_revision, prompt), v2_call(same_revision, prompt)
    assert (first["cache_status"], second["cache_status"]) == (["miss"], ["exact"])
    assert first["text_output"] == second["text_output"]
    question = unique("Name a vegetable.")
    assert chat(same_revision, question)[0] == "miss"
    assert chat(same_revision, question)[0] == "exact"
    streamed = unique("Name a tree.")
    assert chat(same_revision, streamed, stream=True)[0] == "miss"
    assert chat(same_revision, streamed, stream=True)[0] == "exact"
    assert skipped(same_revision) == 0


def test_other_revision_is_served_but_not_cached(other_revision: Transformer) -> None:
    before = skipped(other_revision)
    prompt = unique("Name a color.")
    first, second = v2_call(other_revision, prompt), v2_call(other_revision, prompt)
    assert (first["cache_status"], second["cache_status"]) == (["miss"], ["miss"])
    assert first["text_output"] == second["text_output"] and first["text_output"][0]
    question = unique("Name an animal.")
    (s1, a1), (s2, a2) = chat(other_revision, question), chat(other_revision, question)
    assert (s1, s2) == ("miss", "miss") and a1 == a2 and a1
    streamed = unique("Name a river.")
    (s1, a1), (s2, a2) = (chat(other_revision, streamed, stream=True),
                          chat(other_revision, streamed, stream=True))
    assert (s1, s2) == ("miss", "miss") and a1 == a2 and a1
    assert skipped(other_revision) == before + 6
