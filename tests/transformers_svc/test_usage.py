"""Usage is what tenants are billed on: every path (v2 REST/gRPC, generate, completions, chat, stream
or not, hit or miss) reports the same prompt and completion tokens for the same prompt, and the
same as the predictor itself. Plus what the transformer's responses say beside the answer."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import httpx
import openai

from semserve.v2 import grpc_service as service
from semserve.v2 import grpc_tensors as tensors
from semserve.v2 import inference_pb2 as pb
from tests.conftest import Predictor, Transformer

SYSTEM = "You answer in one short sentence."


def unique(text: str) -> str:
    return f"{text} (ref {uuid.uuid4().hex[:6]})"


def v2_rest(base: str, prompt: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": 12, "temperature": 0}}
    r = httpx.post(f"{base}/v2/models/llm/infer", json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def v2_grpc(address: str, name: str, data: str) -> tuple[int, int, str]:
    request = pb.ModelInferRequest(model_name="llm", id="usage")
    request.inputs.add(name=name, datatype="BYTES", shape=[1]).contents.bytes_contents.append(data.encode())
    request.parameters["max_tokens"].int64_param = 12
    request.parameters["temperature"].double_param = 0.0
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            service.MODEL_INFER, request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        response = call(request, timeout=120)
    columns = tensors.output_columns(response)
    params = tensors.plain_parameters(response.parameters)
    status = columns["cache_status"][0].decode()
    return int(params["prompt_tokens"]), int(columns["completion_tokens"][0]), status


def test_completion_usage_is_the_same_on_every_path(transformer: Transformer, predictor: Predictor) -> None:
    prompt = unique("The three primary colors are")
    direct = openai.OpenAI(base_url=predictor.openai_base, api_key="x", max_retries=0).completions.create(
        model="llm", prompt=prompt, temperature=0, max_tokens=12)
    expected = (direct.usage.prompt_tokens, direct.usage.completion_tokens)

    miss = v2_rest(transformer.http, prompt)  # the miss that fills the cache, over v2
    outputs = {o["name"]: o["data"] for o in miss["outputs"]}
    assert outputs["cache_status"] == ["miss"]
    assert (miss["parameters"]["prompt_tokens"], outputs["completion_tokens"][0]) == expected

    client = openai.OpenAI(base_url=transformer.openai_base, api_key="x", max_retries=0)
    hit = client.completions.with_raw_response.create(
        model="llm", prompt=prompt, temperature=0, max_tokens=12)
    assert hit.headers["x-semserve-cache"] == "exact"
    assert (hit.parse().usage.prompt_tokens, hit.parse().usage.completion_tokens) == expected
    chunks = list(client.completions.create(model="llm", prompt=prompt, temperature=0, max_tokens=12,
                                            stream=True, stream_options={"include_usage": True}))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == expected
    prompt_tokens, completion_tokens, status = v2_grpc(transformer.grpc, "text_input", prompt)
    assert status == "exact" and (prompt_tokens, completion_tokens) == expected
    generated = httpx.post(f"{transformer.http}/v2/models/llm/generate", timeout=120, json={
        "text_input": prompt, "parameters": {"max_tokens": 12, "temperature": 0}}).json()
    assert (generated["parameters"]["prompt_tokens"], generated["completion_tokens"]) == expected


def test_chat_usage_is_the_same_on_every_path(transformer: Transformer, predictor: Predictor) -> None:
    question = unique("What is the capital of France?")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    own = openai.OpenAI(base_url=predictor.openai_base, api_key="x", max_retries=0)
    direct = own.chat.completions.create(model="llm", messages=messages, temperature=0, max_tokens=12)
    expected = (direct.usage.prompt_tokens, direct.usage.completion_tokens)

    client = openai.OpenAI(base_url=transformer.openai_base, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="llm", messages=messages, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == expected  # the miss
    hit = client.chat.completions.with_raw_response.create(model="llm", messages=messages, temperature=0,
                                                           max_tokens=12)
    assert hit.headers["x-semserve-cache"] == "exact"
    assert (hit.parse().usage.prompt_tokens, hit.parse().usage.completion_tokens) == expected
    # The same chat over v2 (the `chat` input) is the same cache entry, with the same usage.
    chat = json.dumps({"messages": messages})
    prompt_tokens, completion_tokens, status = v2_grpc(transformer.grpc, "chat", chat)
    assert status == "exact" and (prompt_tokens, completion_tokens) == expected


def test_v2_response_id_is_the_request_id_header(transformer: Transformer, predictor: Predictor) -> None:
    for base in (transformer.http, predictor.http):
        answer = v2_rest(base, unique("Name a color:"), headers={"x-request-id": "my-request-7"})
        assert answer["id"] == "my-request-7"


def test_a_miss_names_the_rejected_similarity_as_such(transformer: Transformer) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="x", max_retries=0)
    topic = uuid.uuid4().hex[:6]
    # A changed number: close in embedding space, and a look-alike the verifier rejects.
    stored = f"How many days are there in 3 weeks of project {topic}?"
    asked = f"How many days are there in 5 weeks of project {topic}?"
    # max_tokens as v2_rest's: entries of other sampling parameters are never candidates.
    client.completions.create(model="llm", prompt=stored, temperature=0, max_tokens=12)
    raw = client.completions.with_raw_response.create(model="llm", prompt=asked, temperature=0, max_tokens=12)
    assert raw.headers["x-semserve-cache"] == "miss"
    assert "x-semserve-cache-similarity" not in raw.headers
    assert 0.7 <= float(raw.headers["x-semserve-cache-rejected-similarity"]) <= 1
    answer = v2_rest(transformer.http, asked.replace("5 weeks", "6 weeks"))
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs["cache_status"] == ["miss"]
    assert "cache_similarity" not in answer["parameters"]
    assert 0.7 <= answer["parameters"]["cache_rejected_similarity"] <= 1


def test_openai_errors_name_the_field_and_models_have_a_creation_time(transformer: Transformer) -> None:
    r = httpx.post(f"{transformer.openai_base}/completions", timeout=60, json={
        "model": "llm", "prompt": unique("hi"), "max_tokens": 100000, "temperature": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    cards = httpx.get(f"{transformer.openai_base}/models", timeout=10).json()["data"]
    assert cards[0]["created"] > 1_700_000_000


def _sse_chunks(base: str, route: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    with httpx.stream("POST", f"{base}/{route}", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]], r.headers.get("x-semserve-cache", "")


def _counted(chunks: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"]) for c in chunks if c["choices"]]


def test_continuous_usage_rises_chunk_by_chunk_on_misses_and_hits(
    transformer: Transformer, predictor: Predictor
) -> None:
    # vLLM's `continuous_usage_stats`: with include_usage, every chunk carries the usage so far; the
    # last chunk the whole request's. Without it, OpenAI's include_usage: the field is null but last.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": unique("Name a river.")}]
    continuous = {"include_usage": True, "continuous_usage_stats": True}
    for route, body in (
        ("chat/completions", {"model": "llm", "messages": messages, "temperature": 0, "max_tokens": 12}),
        ("completions", {"model": "llm", "prompt": unique("The longest river is"), "temperature": 0,
                         "max_tokens": 12}),
    ):  # fmt: skip
        body = {**body, "stream_options": continuous}
        direct, _ = _sse_chunks(predictor.openai_base, route, body)
        whole = direct[-1]["usage"]
        for expected_cache in ("miss", "exact"):
            chunks, cache = _sse_chunks(transformer.openai_base, route, body)
            assert cache == expected_cache
            for served in (direct, chunks):
                counted = _counted(served)
                assert counted and all(p == whole["prompt_tokens"] for p, _ in counted), (route, counted)
                completions = [n for _, n in counted]
                assert completions == sorted(completions) and completions[-1] == whole["completion_tokens"]
                assert served[-1]["choices"] == [] and served[-1]["usage"] == whole
        final_only, _ = _sse_chunks(transformer.openai_base, route,
                                    {**body, "stream_options": {"include_usage": True}})  # fmt: skip
        assert all(c["usage"] is None for c in final_only[:-1]) and final_only[-1]["usage"] == whole
