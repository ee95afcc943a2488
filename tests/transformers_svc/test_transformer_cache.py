"""The transformer in front of the real predictor, with a real Redis: what is served from the cache,
what is not, and what reaches the predictor (counted from the predictor's own metrics)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import openai
import pytest

from tests.conftest import Predictor, Transformer, start_transformer
from tests.support import metric_value

GENERATIONS = "semserve_predictor_generations_total"


def generations(p: Predictor) -> float:
    return metric_value(httpx.get(f"{p.http}/metrics").text, GENERATIONS)


def unique(text: str) -> str:
    # A fresh topic per test keeps entries of other tests (same tenant, same index) out of the way.
    return f"{text} (ref {uuid.uuid4().hex[:6]})"


def v2(t: Transformer, prompts: list[str], headers: dict[str, str] | None = None, **params: object):
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [len(prompts)], "data": prompts}],
        "parameters": {"max_tokens": 12, "temperature": 0, **params},
    }
    r = httpx.post(f"{t.http}/v2/models/llm/infer", json=body, headers=headers or {}, timeout=120)
    return r


def out(r: httpx.Response) -> dict[str, list]:
    assert r.status_code == 200, r.text
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


def chat(t: Transformer, content: str, headers: dict[str, str] | None = None, **kw: object) -> httpx.Response:
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 24, **kw}
    return httpx.post(f"{t.openai_base}/chat/completions", json=body, headers=headers or {}, timeout=120)


def test_exact_hit_answers_without_the_predictor(transformer: Transformer, predictor: Predictor) -> None:
    prompt = unique("Name a primary color.")
    before = generations(predictor)
    first = out(v2(transformer, [prompt]))
    second = out(v2(transformer, [prompt]))
    assert first["cache_status"] == ["miss"] and second["cache_status"] == ["exact"]
    assert first["text_output"] == second["text_output"]
    assert first["completion_tokens"] == second["completion_tokens"]
    assert generations(predictor) == before + 1
    # The answer equals what the predictor itself returns for the prompt.
    direct = httpx.post(f"{predictor.http}/v2/models/llm/infer", json={
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": {"max_tokens": 12, "temperature": 0}}, timeout=60)
    assert out(direct)["text_output"] == first["text_output"]


def test_paraphrase_is_a_semantic_hit(transformer: Transformer, predictor: Predictor) -> None:
    first = chat(transformer, "How do I reset my password?")
    assert first.status_code == 200 and first.headers["x-semserve-cache"] in ("miss", "exact")
    before = generations(predictor)
    para = chat(transformer, "How can I reset my password?")
    assert para.status_code == 200, para.text
    assert para.headers["x-semserve-cache"] == "semantic"
    assert float(para.headers["x-semserve-cache-similarity"]) > 0.8
    assert para.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert generations(predictor) == before


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("Cancel my subscription today.", "Don't cancel my subscription today."),
        ("Book a flight from Paris to Rome.", "Book a flight from Rome to Paris."),
        ("Is 3 tablets of ibuprofen safe?", "Is 30 tablets of ibuprofen safe?"),
    ],
)
def test_look_alike_is_rejected(transformer: Transformer, stored: str, asked: str) -> None:
    assert chat(transformer, stored).status_code == 200
    r = chat(transformer, asked)
    assert r.status_code == 200
    assert r.headers["x-semserve-cache"] == "miss"


def test_sampling_parameters_and_system_prompt_change_the_key(transformer: Transformer) -> None:
    q = unique("Give me a fruit.")

    # Four tokens: the keys are under test, not the answers, and each miss is a generation.
    def ask(content: str, **kw: object) -> httpx.Response:
        return chat(transformer, content, **{"max_tokens": 4, **kw})

    assert ask(q).headers["x-semserve-cache"] == "miss"
    assert ask(q).headers["x-semserve-cache"] == "exact"
    assert ask(q, max_tokens=5).headers["x-semserve-cache"] == "miss"
    assert ask(q, seed=3).headers["x-semserve-cache"] == "miss"
    # vLLM's penalties, min_p, min_tokens and text options change the answer: each keys apart, then
    # hits itself.
    adjustments = [{"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"repetition_penalty": 1.2},
                   {"min_p": 0.1}, {"min_tokens": 2}, {"stop_token_ids": [13]},
                   {"skip_special_tokens": False}, {"logit_bias": {"13": 5}},
                   {"stop": ["."], "include_stop_str_in_output": True}]  # fmt: skip
    for adjustment in adjustments:
        assert ask(q, **adjustment).headers["x-semserve-cache"] == "miss", adjustment
        assert ask(q, **adjustment).headers["x-semserve-cache"] == "exact", adjustment
    # At its default an adjustment is no adjustment: the plain request's entry.
    defaults = {"repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": [], "skip_special_tokens": True}
    assert ask(q, **defaults).headers["x-semserve-cache"] == "exact"
    # They reach the predictor: the stop string stays in the text when asked to.
    [cut, kept] = [ask(q, stop=["."], include_stop_str_in_output=keep, max_tokens=40)
                   for keep in (False, True)]  # fmt: skip
    [cut_text, kept_text] = [r.json()["choices"][0]["message"]["content"] for r in (cut, kept)]
    assert kept_text == cut_text + ".", (cut_text, kept_text)
    # v2 takes the token ids as a JSON list in a string parameter, as it takes `stop`.
    assert out(v2(transformer, [q], stop_token_ids="[13]"))["cache_status"] == ["miss"]
    assert out(v2(transformer, [q], stop_token_ids="[13]"))["cache_status"] == ["exact"]
    with_system = {"model": "llm", "temperature": 0, "max_tokens": 24, "messages": [
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": q}]}
    r = httpx.post(f"{transformer.openai_base}/chat/completions", json=with_system, timeout=120)
    assert r.headers["x-semserve-cache"] == "miss"
    # v2 shares entries with completions (raw prompt in, text out), never with chat.
    assert out(v2(transformer, [q], max_tokens=24))["cache_status"] == ["miss"]


def test_sampled_requests_bypass_by_default(transformer: Transformer) -> None:
    q = unique("Tell me a colour.")
    r1 = chat(transformer, q, temperature=0.8)
    r2 = chat(transformer, q, temperature=0.8)
    assert r1.headers["x-semserve-cache"] == r2.headers["x-semserve-cache"] == "bypass"


def test_no_store_and_no_cache(transformer: Transformer, predictor: Predictor) -> None:
    q = unique("Say hello.")
    assert out(v2(transformer, [q], headers={"cache-control": "no-store"}))["cache_status"] == ["miss"]
    assert out(v2(transformer, [q]))["cache_status"] == ["miss"]  # the no-store answer was not kept
    assert out(v2(transformer, [q]))["cache_status"] == ["exact"]
    before = generations(predictor)
    assert out(v2(transformer, [q], headers={"cache-control": "no-cache"}))["cache_status"] == ["bypass"]
    assert generations(predictor) == before + 1


async def test_single_flight_20_identical_misses_make_one_predictor_call(
    transformer: Transformer, predictor: Predictor
) -> None:
    q = unique("Describe a cat in one sentence.")
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [q]}],
        "parameters": {"max_tokens": 24, "temperature": 0},
    }
    async with httpx.AsyncClient(timeout=120) as client:
        before = metric_value((await client.get(f"{predictor.http}/metrics")).text, GENERATIONS)
        responses = await asyncio.gather(
            *(client.post(f"{transformer.http}/v2/models/llm/infer", json=body) for _ in range(20))
        )
        after = metric_value((await client.get(f"{predictor.http}/metrics")).text, GENERATIONS)
    texts = {r.json()["outputs"][0]["data"][0] for r in responses if r.status_code == 200}
    assert all(r.status_code == 200 for r in responses)
    assert len(texts) == 1
    assert after == before + 1


def test_batch_mixes_hits_and_misses(transformer: Transformer) -> None:
    a, b = unique("Name a planet."), unique("Name an ocean.")
    out(v2(transformer, [a]))
    both = out(v2(transformer, [a, b]))
    assert both["cache_status"] == ["exact", "miss"]


def test_streaming_miss_then_streaming_hit_through_openai_client(transformer: Transformer) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    q = unique("What is the capital of France?")
    raw = client.chat.completions.with_raw_response.create(
        model="llm", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=24,
        stream=True, stream_options={"include_usage": True},
    )
    first_status = raw.headers["x-semserve-cache"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert first_status == "miss" and text
    assert chunks[-1].usage is not None
    raw2 = client.chat.completions.with_raw_response.create(
        model="llm", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=24, stream=True,
    )
    assert raw2.headers["x-semserve-cache"] == "exact"
    chunks2 = list(raw2.parse())
    assert chunks2[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks2 if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks2 if c.choices and c.choices[0].finish_reason]
    # A non-streaming request for the same conversation is served the same answer.
    again = chat(transformer, q)
    assert again.headers["x-semserve-cache"] == "exact"
    assert again.json()["choices"][0]["message"]["content"] == text


async def test_aborted_stream_is_not_stored(transformer: Transformer, predictor: Predictor) -> None:
    q = unique("Write a long essay about rivers.")
    body = {"model": "llm", "messages": [{"role": "user", "content": q}], "temperature": 0,
            "max_tokens": 400, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{transformer.openai_base}/chat/completions", json=body) as r:
            assert r.headers["x-semserve-cache"] == "miss"
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data: ")
                if n >= 4:
                    break
    await asyncio.sleep(1.0)
    # Asked again, and left once its headers say what the cache had: nothing (a whole answer of 400
    # tokens would only take time).
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{transformer.openai_base}/chat/completions", json=body) as r:
            assert r.headers["x-semserve-cache"] == "miss"


def test_completions_share_entries_with_v2(transformer: Transformer) -> None:
    q = unique("The best thing about summer is")
    out(v2(transformer, [q], max_tokens=10))
    r = httpx.post(f"{transformer.openai_base}/completions",
                   json={"model": "llm", "prompt": q, "max_tokens": 10, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.headers["x-semserve-cache"] == "exact"


def test_v2_grpc_through_the_transformer(transformer: Transformer) -> None:
    from kserve import InferenceGRPCClient, InferInput, InferRequest

    q = unique("Name a musical instrument.")

    async def run() -> list[str]:
        client = InferenceGRPCClient(transformer.grpc, timeout=120, retries=0)
        statuses = []
        for _ in range(2):
            req = InferRequest("llm", [InferInput("text_input", [1], "BYTES", [q])],
                               parameters={"max_tokens": 8, "temperature": 0})
            resp = await client.infer(req)
            statuses.append(resp.get_output_by_name("cache_status").as_numpy().tolist()[0])
        await client.close()
        return [s.decode() if isinstance(s, bytes) else s for s in statuses]

    assert asyncio.run(run()) == ["miss", "exact"]


def test_bad_input_is_4xx_through_the_transformer(transformer: Transformer) -> None:
    r = httpx.post(f"{transformer.http}/v2/models/llm/infer", json={"inputs": []})
    assert r.status_code == 400 and "text_input" in r.text
    assert v2(transformer, ["hi"], max_tokens=0).status_code == 400
    # The predictor's own checks pass through as 400 with its message.
    long = v2(transformer, ["word " * 3000])
    assert long.status_code == 400 and "context" in long.text
    # Streamed with a prompt that works: still a 400 before the stream starts, not a broken stream.
    r = httpx.post(f"{transformer.openai_base}/completions", timeout=60, json={
        "model": "llm", "prompt": [unique("Hello"), "word " * 3000], "max_tokens": 4, "stream": True})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text
    r = chat(transformer, "hi", temperature=-1)
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    r = httpx.post(f"{transformer.openai_base}/chat/completions", content=b"{",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert httpx.post(f"{transformer.http}/v2/models/other/infer",
                      json={"inputs": []}).status_code == 404


def test_metrics_say_what_the_cache_did(transformer: Transformer) -> None:
    text = httpx.get(f"{transformer.http}/metrics").text
    for name in ("semserve_cache_lookups_total", "semserve_cache_lookup_seconds_bucket",
                 "semserve_cache_embedding_seconds_bucket", "semserve_cache_similarity_bucket",
                 "semserve_cache_predictor_calls_saved_total", "semserve_cache_entries_stored_total",
                 "semserve_cache_redis_errors_total", "semserve_cache_singleflight_waiters_total"):
        assert name in text, name
    assert metric_value(text, "semserve_cache_lookups_total", result="exact") > 0


def test_ttl_expiry_and_eviction_cap(predictor: Predictor, redis_url: str) -> None:
    t = start_transformer("short", predictor.grpc, redis_url,
                          "--cache-ttl-seconds", "2", "--cache-max-entries-per-tenant", "2")
    try:
        a = unique("Name a tree.")
        assert out(v2(t, [a]))["cache_status"] == ["miss"]
        assert out(v2(t, [a]))["cache_status"] == ["exact"]
        time.sleep(3)
        assert out(v2(t, [a]))["cache_status"] == ["miss"]  # expired, fixed TTL
        prompts = [unique(f"Name a bird number {i}.") for i in range(3)]
        for p in prompts:
            out(v2(t, [p]))
        # Cap 2: the oldest is evicted, the two newest stay.
        assert out(v2(t, [prompts[2]]))["cache_status"] == ["exact"]
        assert out(v2(t, [prompts[1]]))["cache_status"] == ["exact"]
        assert out(v2(t, [prompts[0]]))["cache_status"] == ["miss"]
    finally:
        t.process.stop()


def test_control_characters_in_request_id_do_not_break_the_upstream_call(transformer: Transformer) -> None:
    # Found by tests/semserve/test_hostile_input.py: a v2 body's `id` may hold any text, but gRPC metadata
    # and HTTP headers may not; the forwarded id is cleaned, the request still answered.
    body = {
        "id": "\x1fweird\nid",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [unique("Hi")]}],
        "parameters": {"max_tokens": 2, "temperature": 0},
    }
    r = httpx.post(f"{transformer.http}/v2/models/llm/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert out(r)["cache_status"] == ["miss"]


def test_n_choices_through_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    # Greedy: n times the same request, one generation shared, then n exact hits.
    q = unique("Name a planet.")
    before = generations(predictor)
    first = chat(transformer, q, n=3)
    assert first.status_code == 200, first.text
    texts = [c["message"]["content"] for c in first.json()["choices"]]
    assert len(texts) == 3 and len(set(texts)) == 1
    assert generations(predictor) - before == 1
    # One request, answered once: the first choice's status is the request's own, in that order.
    assert first.headers["x-semserve-cache"] == "miss,shared,shared"
    again = chat(transformer, q, n=3)
    assert again.headers["x-semserve-cache"] == "exact,exact,exact"
    assert [c["message"]["content"] for c in again.json()["choices"]] == texts
    assert again.json()["usage"] == first.json()["usage"]
    # Seeded: seed + index per choice, each its own entry, each a hit the second time.
    seeded = {"temperature": 0.9, "seed": 21, "n": 2}
    assert chat(transformer, q, **seeded).headers["x-semserve-cache"].split(",") == ["miss", "miss"]
    assert chat(transformer, q, **seeded).headers["x-semserve-cache"] == "exact,exact"
    # The second choice of seed 21 is seed 22's first.
    assert chat(transformer, q, temperature=0.9, seed=22).headers["x-semserve-cache"] == "exact"
    # Completions: prompt by prompt, n choices each.
    body = {"model": "llm", "prompt": [unique("Name a metal:"), unique("Name a gas:")], "temperature": 0,
            "max_tokens": 6, "n": 2}
    r = httpx.post(f"{transformer.openai_base}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    assert r.headers["x-semserve-cache"] == "miss,shared,miss,shared"


def test_n_choices_streamed_through_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)

    def streamed_chat(q: str, **kw: object) -> tuple[str, list[str], object]:
        raw = client.chat.completions.with_raw_response.create(
            model="llm", messages=[{"role": "user", "content": q}], max_tokens=16, stream=True,
            stream_options={"include_usage": True}, **kw)  # fmt: skip
        chunks = list(raw.parse())
        n = kw.get("n", 1)
        assert [c.choices[0].index for c in chunks[:n]] == list(range(n))  # each choice's role first
        assert all(c.choices[0].delta.role == "assistant" for c in chunks[:n])
        mine = [[c.choices[0] for c in chunks if c.choices and c.choices[0].index == i] for i in range(n)]
        texts = ["".join(choice.delta.content or "" for choice in choices) for choices in mine]
        return raw.headers["x-semserve-cache"], texts, chunks[-1].usage

    # Greedy: one generation streamed to every choice, then n exact hits, replayed the same.
    q = unique("Name a planet.")
    before = generations(predictor)
    status, texts, usage = streamed_chat(q, n=3, temperature=0)
    assert status == "miss,shared,shared" and len(set(texts)) == 1 and texts[0], texts
    assert generations(predictor) - before == 1
    status, again, usage_again = streamed_chat(q, n=3, temperature=0)
    assert status == "exact,exact,exact" and again == texts
    assert usage_again.prompt_tokens == usage.prompt_tokens  # the prompt once
    assert usage_again.completion_tokens == usage.completion_tokens
    # The same answers as a whole: the streamed miss stored what the unary request reads.
    whole = chat(transformer, q, n=3, max_tokens=16)
    assert whole.headers["x-semserve-cache"] == "exact,exact,exact"
    assert [c["message"]["content"] for c in whole.json()["choices"]] == texts
    # Seeded: each choice its own generation and entry.
    status, seeded, _ = streamed_chat(q, n=2, temperature=0.9, seed=5)
    assert status == "miss,miss" and all(seeded), seeded
    status, seeded_again, _ = streamed_chat(q, n=2, temperature=0.9, seed=5)
    assert status == "exact,exact" and seeded_again == seeded
    # Completions: several prompts streamed together, choice index = prompt * n + j.
    prompts = [unique("The capital of France is"), unique("The capital of Italy is")]
    raw = client.completions.with_raw_response.create(
        model="llm", prompt=prompts, temperature=0, max_tokens=6, stream=True,
        stream_options={"include_usage": True})  # fmt: skip
    chunks = list(raw.parse())
    assert raw.headers["x-semserve-cache"] == "miss,miss"
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
                for i in (0, 1)]  # fmt: skip
    whole = httpx.post(f"{transformer.openai_base}/completions", timeout=120, json={
        "model": "llm", "prompt": prompts, "temperature": 0, "max_tokens": 6})  # fmt: skip
    assert whole.headers["x-semserve-cache"] == "exact,exact"
    assert [c["text"] for c in whole.json()["choices"]] == streamed
    assert chunks[-1].usage.prompt_tokens == whole.json()["usage"]["prompt_tokens"]
    assert chunks[-1].usage.completion_tokens == whole.json()["usage"]["completion_tokens"]


def test_completion_echo_is_not_part_of_the_answer(transformer: Transformer) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    prompt = unique("The capital of France is")
    echoed = client.completions.with_raw_response.create(model="llm", prompt=prompt, temperature=0,
                                                          max_tokens=6, echo=True)  # fmt: skip
    assert echoed.headers["x-semserve-cache"] == "miss"
    text = echoed.parse().choices[0].text
    assert text.startswith(prompt) and len(text) > len(prompt)
    # The entry holds the answer alone: the same request without echo is a hit without the prompt.
    ask = {"model": "llm", "prompt": prompt, "temperature": 0, "max_tokens": 6}
    plain = client.completions.with_raw_response.create(**ask)
    assert plain.headers["x-semserve-cache"] == "exact"
    assert prompt + plain.parse().choices[0].text == text
    chunks = list(client.completions.create(**ask, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(prompt)
    assert "".join(c.choices[0].text for c in chunks) == text


def test_logprobs_pass_through_and_bypass_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    ask = {"model": "llm", "prompt": unique("The capital of France is"), "temperature": 0, "max_tokens": 4}
    assert client.completions.with_raw_response.create(**ask).headers["x-semserve-cache"] == "miss"
    # Entries keep no logprobs: a request for them is generated, and stores nothing.
    before = generations(predictor)
    raw = client.completions.with_raw_response.create(**ask, logprobs=2)
    assert raw.headers["x-semserve-cache"] == "bypass" and generations(predictor) == before + 1
    choice = raw.parse().choices[0]
    assert len(choice.logprobs.tokens) == 4 and all(len(t) <= 2 for t in choice.logprobs.top_logprobs)
    if choice.finish_reason == "length":
        assert "".join(choice.logprobs.tokens) == choice.text
    # Streamed through the predictor's ModelStreamInfer: every token's logprob arrives.
    chunks = list(client.completions.create(**ask, logprobs=2, stream=True))
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks if c.choices[0].logprobs) == 4
    chat = client.chat.completions.with_raw_response.create(
        model="llm", messages=[{"role": "user", "content": ask["prompt"]}], temperature=0, max_tokens=4,
        logprobs=True, top_logprobs=1)  # fmt: skip
    assert chat.headers["x-semserve-cache"] == "bypass"
    assert len(chat.parse().choices[0].logprobs.content) == chat.parse().usage.completion_tokens
    # v2: the `logprobs` parameter, the `logprobs` output (JSON per answer).
    outputs = out(v2(transformer, [ask["prompt"]], max_tokens=4, logprobs=1))
    assert outputs["cache_status"] == ["bypass"]
    [tokens] = [json.loads(v) for v in outputs["logprobs"]]
    assert len(tokens) == outputs["completion_tokens"][0] and all(len(t[2]) == 1 for t in tokens)


def test_echo_with_logprobs_passes_through_and_bypasses_the_cache(
    transformer: Transformer, predictor: Predictor
) -> None:
    # lm-evaluation-harness's loglikelihood request: the prompt's logprobs come from the predictor
    # (gRPC, a column of their own) as the predictor reports them to a client of its own.
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=predictor.openai_base, api_key="unused", max_retries=0)
    ask = {"model": "llm", "prompt": unique("The capital of France is Paris"), "temperature": 0,
           "max_tokens": 1, "logprobs": 1, "echo": True}  # fmt: skip
    before = generations(predictor)
    raw = client.completions.with_raw_response.create(**ask)
    assert raw.headers["x-semserve-cache"] == "bypass" and generations(predictor) == before + 1
    got, own = raw.parse().choices[0], direct.completions.create(**ask).choices[0]
    assert got.text == own.text and got.text.startswith(ask["prompt"])
    assert got.logprobs.tokens == own.logprobs.tokens and got.logprobs.text_offset == own.logprobs.text_offset
    assert got.logprobs.token_logprobs[0] is None and got.logprobs.top_logprobs[0] is None
    assert got.logprobs.token_logprobs[1:] == pytest.approx(own.logprobs.token_logprobs[1:], abs=0.05)
    # max_tokens 0 and streamed, over the predictor's ModelStreamInfer.
    only = client.completions.create(**{**ask, "max_tokens": 0}).choices[0]
    assert only.text == ask["prompt"] and only.logprobs.tokens == got.logprobs.tokens[:-1]
    chunks = list(client.completions.create(**{**ask, "max_tokens": 3}, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed[: len(got.logprobs.tokens)] == got.logprobs.tokens
    assert len(streamed) == len(got.logprobs.tokens) + 2
    # v2: the `prompt_logprobs` parameter, the `prompt_logprobs` output (JSON per answer).
    outputs = out(v2(transformer, [ask["prompt"]], max_tokens=1, prompt_logprobs=1))
    assert outputs["cache_status"] == ["bypass"] and "logprobs" not in outputs
    [tokens] = [json.loads(v) for v in outputs["prompt_logprobs"]]
    assert [t[0] for t in tokens] == got.logprobs.tokens[:-1] and tokens[0][1] is None


def test_token_id_prompts_pass_through_and_bypass_the_cache(
    transformer: Transformer, predictor: Predictor
) -> None:
    # Token ids have no text to match: generated every time, stored never, as the predictor answers.
    from transformers import AutoTokenizer

    from semserve import model_prep

    tokenizer = AutoTokenizer.from_pretrained(str(model_prep.prepare().model_dir))
    text = unique("The capital of France is")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=predictor.openai_base, api_key="unused", max_retries=0)
    ask = {"model": "llm", "temperature": 0, "max_tokens": 4}
    before = generations(predictor)
    for _ in range(2):
        raw = client.completions.with_raw_response.create(**ask, prompt=ids)
        assert raw.headers["x-semserve-cache"] == "bypass"
    assert generations(predictor) == before + 2
    assert raw.parse().choices[0].text == direct.completions.create(**ask, prompt=ids).choices[0].text
    # lm-eval's default loglikelihood request: token ids, echo, logprobs 1, max_tokens 1.
    score = {**ask, "max_tokens": 1, "prompt": [ids, ids[:-1]], "echo": True, "logprobs": 1}
    scored, own = client.completions.create(**score), direct.completions.create(**score)
    for got, theirs in zip(scored.choices, own.choices, strict=True):
        assert got.text == theirs.text and got.logprobs.tokens == theirs.logprobs.tokens
        assert got.logprobs.token_logprobs[1:] == pytest.approx(theirs.logprobs.token_logprobs[1:], abs=0.05)
    assert scored.choices[0].text.startswith(text)
    chunks = list(client.completions.create(**ask, prompt=ids, echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(text)
    # v2 input_ids through the transformer, and a bad id answered as the predictor answers it.
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [len(ids)], "data": ids}],
            "parameters": {"max_tokens": 4, "temperature": 0}}  # fmt: skip
    outputs = out(httpx.post(f"{transformer.http}/v2/models/llm/infer", json=body, timeout=120))
    assert outputs["cache_status"] == ["bypass"] and outputs["prompt_text"] == [text]
    r = httpx.post(f"{transformer.openai_base}/completions", json={**ask, "prompt": [1, 10**6]}, timeout=60)
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"], r.text


def test_structured_outputs_through_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    q = unique("What is the capital of France? Answer in JSON.")
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    as_json = {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}}
    first = chat(transformer, q, max_tokens=40, response_format=as_json)
    assert first.status_code == 200 and first.headers["x-semserve-cache"] == "miss", first.text
    answer = first.json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(answer)["city"], str)
    again = chat(transformer, q, max_tokens=40, response_format=as_json)
    assert again.headers["x-semserve-cache"] == "exact"
    assert again.json()["choices"][0]["message"]["content"] == answer
    # Another constraint is another entry, never the JSON one's answer; so is no constraint.
    assert chat(transformer, q, max_tokens=40, response_format={"type": "json_object"}).headers[
        "x-semserve-cache"] == "miss"
    assert chat(transformer, q, max_tokens=40).headers["x-semserve-cache"] == "miss"
    # v2 clients ask in the chat input, as the OpenAI route does (the same entry), or by parameter.
    chat_input = json.dumps({"messages": [{"role": "user", "content": q}], "response_format": as_json})
    body = {"inputs": [{"name": "chat", "datatype": "BYTES", "shape": [1], "data": [chat_input]}],
            "parameters": {"max_tokens": 40, "temperature": 0}}  # fmt: skip
    outputs = out(httpx.post(f"{transformer.http}/v2/models/llm/infer", json=body, timeout=120))
    assert outputs["cache_status"] == ["exact"] and outputs["text_output"] == [answer]
    digits = out(v2(transformer, [unique("Pick a number:")], structured_outputs='{"regex": "[0-9]{3}"}'))
    assert digits["cache_status"] == ["miss"] and len(digits["text_output"][0]) == 3
    assert digits["text_output"][0].isdigit(), digits


def test_tool_calls_through_the_cache(transformer: Transformer, predictor: Predictor) -> None:
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}}  # fmt: skip
    clock = {"type": "function", "function": {"name": "get_time"}}
    call_weather = {"type": "function", "function": {"name": "get_weather"}}
    client = openai.OpenAI(base_url=transformer.openai_base, api_key="unused", max_retries=0)
    q = unique("What is the weather in Paris?")
    ask = {"model": "llm", "messages": [{"role": "user", "content": q}], "tools": [weather, clock],
           "temperature": 0, "max_tokens": 40}  # fmt: skip
    before = generations(predictor)
    first = client.chat.completions.with_raw_response.create(**ask, tool_choice=call_weather)
    assert first.headers["x-semserve-cache"] == "miss"
    [call] = first.parse().choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # The stored text is the call: a hit makes the same call, whole or streamed (a new call id each time).
    again = client.chat.completions.with_raw_response.create(**ask, tool_choice=call_weather)
    assert again.headers["x-semserve-cache"] == "exact"
    [same] = again.parse().choices[0].message.tool_calls
    assert (same.function.name, same.function.arguments) == (call.function.name, call.function.arguments)
    assert same.id != call.id
    streamed = client.chat.completions.with_raw_response.create(**ask, tool_choice=call_weather, stream=True)
    assert streamed.headers["x-semserve-cache"] == "exact"
    deltas = [c.choices[0].delta.tool_calls[0] for c in streamed.parse()
              if c.choices and c.choices[0].delta.tool_calls]  # fmt: skip
    assert deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    assert generations(predictor) - before == 1
    # Another tool_choice is another constraint and another entry; so are other tools.
    # (One call at most, with room to finish it: several calls may not fit in max_tokens.)
    one_call = {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 60}
    required = client.chat.completions.with_raw_response.create(**{**ask, **one_call})
    assert required.headers["x-semserve-cache"] == "miss"
    assert required.parse().choices[0].finish_reason == "tool_calls"
    other_tools = client.chat.completions.with_raw_response.create(**{**ask, "tools": [weather]},
                                                                   tool_choice=call_weather)  # fmt: skip
    assert other_tools.headers["x-semserve-cache"] == "miss"
    # A v2 client asks in its chat input and reads the call's arguments as the text output.
    chat_input = json.dumps({"messages": ask["messages"], "tools": ask["tools"], "tool_choice": call_weather})
    body = {"inputs": [{"name": "chat", "datatype": "BYTES", "shape": [1], "data": [chat_input]}],
            "parameters": {"max_tokens": 40, "temperature": 0}}  # fmt: skip
    outputs = out(httpx.post(f"{transformer.http}/v2/models/llm/infer", json=body, timeout=120))
    assert outputs["cache_status"] == ["exact"] and outputs["text_output"] == [call.function.arguments]
    # "auto" needs a parser this model has none of: a 400 from the transformer as from the predictor.
    refused = chat(transformer, q, tools=[weather])
    assert refused.status_code == 400 and "needs a parser" in refused.json()["error"]["message"]
