"""Every protocol through every hop, as in Knative mode: the suite's transformer knows only the
predictor's gRPC address. tritonclient (sync and asyncio streaming, numpy 2) and the `openai` client
against both services; the generate extension; single flight of streaming misses; cancellation and a
predictor lost mid-stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import FRANCE, Predictor, Transformer, start_transformer
from tests.support import TcpProxy, metric_value

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "triton_check.py"
GENERATIONS = "semserve_predictor_generations_total"
ABORTED = "semserve_predictor_requests_aborted_total"
SYSTEM = "You answer in one short sentence."


def unique(text: str) -> str:
    return f"{text} (ref {uuid.uuid4().hex[:6]})"


def triton(scenario: str, grpc_address: str, http_base: str, args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), scenario, grpc_address, http_base.removeprefix("http://"),
         json.dumps(args)],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def predictor_metric(p: Predictor, name: str) -> float:
    return metric_value(httpx.get(f"{p.http}/metrics", timeout=10).text, name)


@pytest.fixture(params=["predictor", "transformer"])
def target(request: pytest.FixtureRequest) -> Predictor | Transformer:
    return request.getfixturevalue(request.param)


def test_tritonclient_unary_reads_every_output_with_numpy_2(target: Predictor | Transformer) -> None:
    got = triton("unary", target.grpc, target.http, {"prompts": [FRANCE, "Name a fruit:"], "max_tokens": 12})
    grpc_out, http_out = got["grpc"], got["http"]
    assert "Paris" in grpc_out["text_output"][0] and "Paris" in http_out["text_output"][0]
    assert grpc_out["id"] == "unary-1"
    assert all(r in ("stop", "length") for r in grpc_out["finish_reason"])
    assert all(n > 0 for n in grpc_out["completion_tokens"] + http_out["completion_tokens"])
    # Every output raw, as Triton sends them (the transformer adds cache_status).
    assert grpc_out["raw_outputs"] == (3 if isinstance(target, Predictor) else 4)


@pytest.mark.parametrize("mode", ["stream", "aio"])
def test_tritonclient_stream_pieces_final_flags_and_errors(
    target: Predictor | Transformer, mode: str
) -> None:
    def templated(question: str) -> str:
        return f"<|im_start|>user\n{unique(question)}<|im_end|>\n<|im_start|>assistant\n"

    got = triton(mode, target.grpc, target.http, {"requests": [
        {"id": "pieces", "prompt": templated("Name three rivers."), "stream": True, "max_tokens": 16},
        {"id": "whole", "prompt": templated("Name three mountains."), "stream": False, "max_tokens": 16,
         "empty_final": True},
        {"id": "bad", "prompt": "   ", "stream": True, "max_tokens": 16},
        {"id": "chat", "prompt": json.dumps({"messages": [{"role": "system", "content": SYSTEM},
                                                          {"role": "user", "content": "What is the capital "
                                                           "of France?"}]}),
         "chat": True, "stream": True, "max_tokens": 16},
    ]})
    responses = got["responses"]
    # A bad request is an error on the stream; the stream goes on for the others.
    assert len(got["errors"]) == 1 and "text_input[0] is empty" in got["errors"][0]
    pieces = responses["pieces"]
    assert len(pieces) >= 3 and all(r["id"] == "pieces" for r in pieces)
    assert [r["final"] for r in pieces] == [False] * (len(pieces) - 1) + [True]
    assert all(r["finish_reason"] == [""] for r in pieces[:-1])
    assert pieces[-1]["finish_reason"][0] in ("stop", "length")
    tokens = [r["completion_tokens"][0] for r in pieces]
    assert tokens == sorted(tokens) and tokens[-1] > 0
    assert "".join(r["text_output"][0] for r in pieces).strip()
    # One response with the whole answer, then the empty final response it asked for (the asyncio
    # client cannot ask for one).
    whole = responses["whole"]
    if mode == "stream":
        assert [r["final"] for r in whole] == [False, True] and whole[1]["text_output"] is None
    else:
        assert [r["final"] for r in whole] == [True]
    assert whole[0]["text_output"][0] and whole[0]["finish_reason"][0] in ("stop", "length")
    # The chat input: the predictor applies the chat template.
    assert "Paris" in "".join(r["text_output"][0] for r in responses["chat"])
    if isinstance(target, Transformer):
        assert all(r["cache_status"] == ["miss"] for r in pieces + whole[:1])


def test_stream_miss_then_replayed_hit_over_model_stream_infer(transformer: Transformer) -> None:
    prompt = f"<|im_start|>user\n{unique('Name a planet.')}<|im_end|>\n<|im_start|>assistant\n"
    requests = [{"id": "q", "prompt": prompt, "stream": True, "max_tokens": 12}]
    first = triton("stream", transformer.grpc, transformer.http, {"requests": requests})["responses"]["q"]
    second = triton("stream", transformer.grpc, transformer.http, {"requests": requests})["responses"]["q"]
    assert {r["cache_status"][0] for r in first} == {"miss"}
    assert {r["cache_status"][0] for r in second} == {"exact"}
    text = "".join(r["text_output"][0] for r in first)
    assert "".join(r["text_output"][0] for r in second) == text
    assert second[-1]["final"] and second[-1]["finish_reason"] == first[-1]["finish_reason"]
    assert second[-1]["completion_tokens"] == first[-1]["completion_tokens"]


def test_cancelled_stream_aborts_the_generation(
    target: Predictor | Transformer, predictor: Predictor
) -> None:
    before = predictor_metric(predictor, ABORTED)
    got = triton("cancel", target.grpc, target.http,
                 {"prompt": unique("Count from one to one thousand:"), "max_tokens": 1500})
    assert got["first"]["text_output"] is not None and not got["first"]["final"]
    deadline = time.monotonic() + 15
    while predictor_metric(predictor, ABORTED) <= before:
        assert time.monotonic() < deadline, "the predictor never aborted the cancelled generation"
        time.sleep(0.2)


def test_generate_extension(target: Predictor | Transformer) -> None:
    body = {"text_input": FRANCE, "parameters": {"max_tokens": 12, "temperature": 0}}
    r = httpx.post(f"{target.http}/v2/models/llm/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert "Paris" in answer["text_output"] and answer["finish_reason"] in ("stop", "length")
    assert answer["model_name"] == "llm" and answer["completion_tokens"] > 0
    events = []
    with httpx.stream("POST", f"{target.http}/v2/models/llm/generate_stream", json=body, timeout=120) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert len(events) >= 2 and "Paris" in "".join(e["text_output"] for e in events)
    assert events[-1]["finish_reason"] in ("stop", "length")
    bad = httpx.post(f"{target.http}/v2/models/llm/generate", json={"text_input": ""}, timeout=30)
    assert bad.status_code == 400 and "text_input" in bad.json()["error"]
    bad = httpx.post(f"{target.http}/v2/models/llm/generate_stream", json={"nope": "x"}, timeout=30)
    assert bad.status_code == 400 and "nope" in bad.json()["error"]
    missing = httpx.post(f"{target.http}/v2/models/other/generate", json=body, timeout=30)
    assert missing.status_code == 404


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_openai_misses_over_grpc_then_hits(transformer: Transformer, kind: str, stream: bool) -> None:
    """The suite's transformer has no HTTP path to the predictor: OpenAI misses work over gRPC."""
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    q = unique("What is the capital of France?")
    # A raw question often ends at once without the chat template: completions get a sentence to go on.
    sentence = f"Note {uuid.uuid4().hex[:6]}. The capital of France is"

    def ask() -> tuple[str, str, Any]:
        if kind == "chat":
            raw = client.chat.completions.with_raw_response.create(
                model="llm", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                temperature=0, max_tokens=24, stream=stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            )
        else:
            raw = client.completions.with_raw_response.create(
                model="llm", prompt=sentence, temperature=0, max_tokens=16, stream=stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            )
        parsed = raw.parse()
        if not stream:
            choice = parsed.choices[0]
            text = choice.message.content if kind == "chat" else choice.text
            return raw.headers["x-semserve-cache"], text, parsed.usage
        chunks = list(parsed)
        if kind == "chat":
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = "".join(c.choices[0].text for c in chunks if c.choices)
        return raw.headers["x-semserve-cache"], text, chunks[-1].usage

    status, text, usage = ask()
    again_status, again_text, again_usage = ask()
    assert (status, again_status) == ("miss", "exact")
    assert text and again_text == text
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert (again_usage.prompt_tokens, again_usage.completion_tokens) == (
        usage.prompt_tokens, usage.completion_tokens)


async def test_identical_streaming_misses_share_one_generation(
    transformer: Transformer, predictor: Predictor
) -> None:
    """16 identical streaming misses at once: one generation; 4 listeners that leave early take
    nothing away from the 12 others, and no generation is aborted."""
    q = unique("Describe the sea in one sentence.")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
    body = {"model": "llm", "messages": messages, "temperature": 0, "max_tokens": 40, "stream": True}
    before, aborted = predictor_metric(predictor, GENERATIONS), predictor_metric(predictor, ABORTED)

    async def one(client: httpx.AsyncClient, leave_early: bool) -> tuple[str, str | None]:
        text, finish = [], None
        async with client.stream("POST", f"{transformer.openai_base}/chat/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                for choice in chunk["choices"]:
                    text.append(choice["delta"].get("content") or "")
                    finish = choice.get("finish_reason") or finish
                if leave_early and len(text) >= 3:
                    return "", None
        return "".join(text), finish

    async with httpx.AsyncClient(timeout=120) as client:
        results = await asyncio.gather(*(one(client, i % 4 == 0) for i in range(16)))
    finished = [r for r in results if r[1] is not None]
    assert len(finished) == 12 and len({text for text, _ in finished}) == 1 and finished[0][0]
    assert predictor_metric(predictor, GENERATIONS) - before == 1
    assert predictor_metric(predictor, ABORTED) == aborted


def test_predictor_lost_mid_stream_is_an_error_event_and_nothing_is_stored(
    predictor: Predictor, redis_url: str
) -> None:
    grpc_port = int(predictor.grpc.rsplit(":", 1)[1])
    proxy = TcpProxy(grpc_port).start()
    t = start_transformer("stream-lost", f"127.0.0.1:{proxy.port}", redis_url)
    q = unique("Write a long story about a lighthouse.")
    body = {"model": "llm", "messages": [{"role": "user", "content": q}], "temperature": 0,
            "max_tokens": 300, "ignore_eos": True, "stream": True}
    try:
        events = []
        with httpx.stream("POST", f"{t.openai_base}/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200 and r.headers["x-semserve-cache"] == "miss"
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 5:
                    proxy.stop()  # the predictor is gone for this transformer, mid-stream
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])
        assert "error" in error and "predictor" in error["error"]["message"]
        proxy = TcpProxy(grpc_port, listen_port=proxy.port).start()
        again = httpx.post(f"{t.openai_base}/chat/completions", json={**body, "stream": False,
                                                                      "max_tokens": 8}, timeout=120)
        assert again.status_code == 200
        # The broken stream was not stored: asked again, the headers say miss (and the 300 tokens
        # are not waited for).
        with httpx.stream("POST", f"{t.openai_base}/chat/completions", json=body, timeout=120) as r:
            assert r.headers["x-semserve-cache"] == "miss"
    finally:
        proxy.stop()
        t.process.stop()


def test_a_streamed_batch_fills_each_prompt_at_its_index(target: Predictor | Transformer) -> None:
    prompts = [f"Note {uuid.uuid4().hex[:6]}. The capital of Italy is",
               f"Note {uuid.uuid4().hex[:6]}. The capital of Spain is"]
    body = {"text_input": prompts, "parameters": {"max_tokens": 8, "temperature": 0}}
    events = []
    with httpx.stream("POST", f"{target.http}/v2/models/llm/generate_stream", json=body, timeout=120) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    texts = ["", ""]
    finished = [None, None]
    for event in events:
        assert len(event["text_output"]) == 2 and sum(bool(t) for t in event["text_output"]) <= 1
        for i in range(2):
            texts[i] += event["text_output"][i]
            finished[i] = event["finish_reason"][i] or finished[i]
    assert texts[0].strip() and texts[1].strip()
    assert all(f in ("stop", "length") for f in finished)


ITL = "semserve_predictor_inter_token_latency_seconds_count"


def test_a_stream_interval_sends_the_same_answer_in_fewer_larger_chunks(
    target: Predictor | Transformer, predictor: Predictor
) -> None:
    """vLLM's `stream_interval`: OpenAI (continuous usage says the tokens so far at each chunk) and
    v2 generate_stream. Through the transformer the first ask is a miss and the others exact hits,
    each grouped to its own interval."""
    client = openai.OpenAI(base_url=target.openai_base, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "You list things, one per line."},
                {"role": "user", "content": unique("Name five rivers of Europe.")}]  # fmt: skip

    def chat(interval: int | None) -> tuple[str, list[int], str]:
        raw = client.chat.completions.with_raw_response.create(
            model="llm", messages=messages, temperature=0, max_tokens=17, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True, **({"stream_interval": interval} if interval else {})},
        )  # fmt: skip
        text, counts = "", []
        for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                counts.append(chunk.usage.completion_tokens)
        return text, counts, raw.headers.get("x-semserve-cache", "")

    def steps(counts: list[int]) -> list[int]:
        return [b - a for a, b in zip([0, *counts], counts, strict=False)]

    outputs_before = predictor_metric(predictor, ITL)
    text, counts, status = chat(4)
    # One latency observation per engine output after the first.
    engine_outputs = predictor_metric(predictor, ITL) - outputs_before + 1
    plain_text, plain_counts, _ = chat(None)
    assert text == plain_text and counts[-1] == plain_counts[-1] == 17
    assert counts[0] <= 2 and all(s >= 4 for s in steps(counts)[1:])  # the last ends at max_tokens
    assert len(counts) < len(plain_counts)
    if isinstance(target, Predictor):
        # The engine itself sent ~4 tokens per output (vLLM's own stream interval): 1, 4, 4, 4, 4.
        assert engine_outputs <= 5, engine_outputs
    else:
        assert status == "miss"
        again, again_counts, again_status = chat(3)  # a replayed hit, in groups of 3 words or more
        assert again_status == "exact" and again == text
        assert all(s >= 3 for s in steps(again_counts)[1:-1])

    parameters = {"max_tokens": 13, "temperature": 0, "ignore_eos": True, "stream_interval": 4}
    body = {"text_input": unique("Count from one to twenty:"), "parameters": parameters}
    with httpx.stream("POST", f"{target.http}/v2/models/llm/generate_stream", json=body, timeout=120) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    v2_counts = [e["completion_tokens"] for e in events if e["text_output"]]
    assert v2_counts[-1] == 13 and all(s >= 4 for s in steps(v2_counts)[1:]), v2_counts
    bad = httpx.post(f"{target.http}/v2/models/llm/generate_stream",
                     json={**body, "parameters": {"stream_interval": 0}}, timeout=30)  # fmt: skip
    assert bad.status_code == 400 and "stream_interval must be in [1" in bad.json()["error"]
