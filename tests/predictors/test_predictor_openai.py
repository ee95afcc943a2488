"""OpenAI routes against the real predictor, through the official `openai` client."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from tests.conftest import Predictor

# A system prompt of these tests' own: with the template's default one, the prompt's first KV blocks
# are shared with every other chat request of the suite and may come from the prefix cache, computed
# inside another test's big batch; on this CPU backend that can change a greedy answer (the soak's
# chat load turned "Paris" into "L'Étoile, la Marseillaise, ...").
QUESTION = [
    {"role": "system", "content": "You are a geography assistant. Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture
def client(predictor: Predictor) -> openai.OpenAI:
    return openai.OpenAI(base_url=predictor.openai_base, api_key="unused", max_retries=0)


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["llm"]
    assert client.models.retrieve("llm").id == "llm"


def test_chat_completion(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=20)
    assert resp.object == "chat.completion"
    assert "Paris" in resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_completion_single_and_list(client: openai.OpenAI) -> None:
    one = client.completions.create(model="llm", prompt="The capital of France is", max_tokens=5,
                                    temperature=0)
    assert one.object == "text_completion" and one.choices[0].text
    many = client.completions.create(model="llm", prompt=["Hello", "Goodbye"], max_tokens=4,
                                     temperature=0)
    assert [c.index for c in many.choices] == [0, 1]


def test_chat_stream_chunk_by_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llm", messages=QUESTION, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2  # one chunk per new piece, not one blob
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens > 0
    whole = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=20)
    assert "".join(pieces) == whole.choices[0].message.content


def test_completion_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="llm", prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks)  # no usage unless asked


def test_sse_wire_format(predictor: Predictor) -> None:
    body = {"model": "llm", "messages": QUESTION, "max_tokens": 5, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{predictor.openai_base}/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nope", "messages": QUESTION}, 404, "nope"),
        ({"model": "llm"}, 400, "messages"),
        ({"model": "llm", "messages": []}, 400, "messages"),
        ({"model": "llm", "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "llm", "messages": QUESTION, "max_tokens": 100000}, 400, "max_tokens"),
        ({"model": "llm", "messages": QUESTION, "temperature": -0.5}, 400, "temperature"),
        ({"model": "llm", "messages": QUESTION, "temperature": "hot"}, 400, "temperature"),
        # vLLM's engine refuses it too; it answered 500 before (found by schemathesis).
        ({"model": "llm", "messages": QUESTION, "temperature": 2.5}, 400, "temperature must be in [0, 2]"),
        ({"model": "llm", "messages": QUESTION, "n": 0}, 400, "n must be >= 1, got 0"),
        ({"model": "llm", "messages": QUESTION, "n": 65}, 400, "at most 64 choices per request (n=65)"),
        ({"model": "llm", "messages": QUESTION, "presence_penalty": 2.5}, 400, "presence_penalty must be"),
        ({"model": "llm", "messages": QUESTION, "repetition_penalty": 0}, 400, "repetition_penalty must"),
        ({"model": "llm", "messages": QUESTION, "min_p": 2}, 400, "min_p must be in [0, 1]"),
        # vLLM refuses them only once queued; it answered 500 then.
        ({"model": "llm", "messages": QUESTION, "stop_token_ids": [10**12]}, 400,
         "stop_token_ids [1000000000000] are outside the vocabulary of 49152 tokens"),
        ({"model": "llm", "messages": QUESTION, "bad_words": ["Paris"]}, 400, "bad_words is not supported"),
        ({"model": "llm", "messages": QUESTION, "structured_outputs": {"regex": "a", "choice": ["a"]}}, 400,
         "structured_outputs must set exactly one of"),
        ({"model": "llm", "messages": QUESTION, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens must"),
        ({"model": "llm", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        ({"model": "llm", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]},
         400, "messages.0.content: part 1 has type 'image_url': this model takes text only"),
        ({"model": "llm", "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context"),
    ],
)
def test_chat_bad_input(predictor: Predictor, body: dict, status: int, needle: str) -> None:
    r = httpx.post(f"{predictor.openai_base}/chat/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_openai_malformed_json_and_empty_prompt(predictor: Predictor) -> None:
    r = httpx.post(f"{predictor.openai_base}/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{predictor.openai_base}/completions", json={"model": "llm", "prompt": ""})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=QUESTION)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="llm", messages=QUESTION, max_tokens=-1)


def test_vllm_s_sampling_extensions_reach_the_engine(client: openai.OpenAI) -> None:
    # The one-sentence answer ends long before 24 tokens; min_tokens holds the end (and the stop
    # string) back until 24 tokens are out. Penalties and min_p are taken as vLLM's server takes them.
    plain = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=48)
    assert plain.usage.completion_tokens < 24, plain
    held = client.chat.completions.create(
        model="llm", messages=QUESTION, temperature=0, max_tokens=48, stop=["."],
        presence_penalty=0.1, frequency_penalty=0.1,
        extra_body={"min_tokens": 24, "repetition_penalty": 1.05, "min_p": 0.05},
    )  # fmt: skip
    assert held.usage.completion_tokens >= 24, held


def test_n_choices(client: openai.OpenAI, predictor: Predictor) -> None:
    one = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=12)
    three = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=12, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert all("Paris" in (c.message.content or "") for c in three.choices), three
    # The prompt once, every choice's tokens (as vLLM counts n).
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert one.usage.completion_tokens < three.usage.completion_tokens <= 3 * 12
    seeded = client.chat.completions.create(model="llm", messages=QUESTION, temperature=1.0, seed=11,
                                            max_tokens=12, n=2)  # fmt: skip
    assert len(seeded.choices) == 2
    # Completions: prompt by prompt, its n choices together.
    prompts = ["The capital of France is", "The capital of Italy is"]
    both = client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4, n=2)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert ["Paris" in c.text for c in both.choices] == [True, True, False, False], both
    assert all("Rome" in c.text for c in both.choices[2:]), both
    r = httpx.post(f"{predictor.openai_base}/completions", timeout=60, json={
        "model": "llm", "prompt": ["a b", "c d"], "max_tokens": 2, "n": 33})
    assert r.status_code == 400 and "at most 64 choices per request (2 prompts x n=33)" in r.text


def test_n_choices_streamed(client: openai.OpenAI) -> None:
    # Chat: each choice's role first (as vLLM sends them), then its pieces under its own index.
    chunks = list(client.chat.completions.create(
        model="llm", messages=QUESTION, temperature=0, max_tokens=12, n=2, stream=True,
        stream_options={"include_usage": True}))  # fmt: skip
    roles = [c.choices[0].index for c in chunks[:2]]
    assert roles == [0, 1] and all(c.choices[0].delta.role == "assistant" for c in chunks[:2])
    mine = [[c.choices[0] for c in chunks if c.choices and c.choices[0].index == i] for i in (0, 1)]
    texts = ["".join(choice.delta.content or "" for choice in choices) for choices in mine]
    assert all("Paris" in t for t in texts), texts
    finals = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finals == [0, 1]
    whole = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=12, n=2)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens == whole.usage.prompt_tokens  # the prompt once
    assert 2 <= usage.completion_tokens <= 2 * 12  # both choices' tokens
    # Completions: two prompts x two choices, index = prompt * n + j, each prompt's tokens once.
    prompts = ["The capital of France is", "The capital of Italy is"]
    chunks = list(client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4, n=2,
                                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(4)]  # fmt: skip
    assert ["Paris" in t for t in texts] == [True, True, False, False], texts
    assert all("Rome" in t for t in texts[2:]), texts
    whole = client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4, n=2)
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert 4 <= chunks[-1].usage.completion_tokens <= 4 * 4


def test_completion_echo(client: openai.OpenAI) -> None:
    # vLLM's echo: the prompt, then the answer; streamed, the prompt comes with each choice's first piece.
    prompts = ["The capital of France is", "The capital of Italy is"]
    plain = client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4)
    echoed = client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4, echo=True)
    expected = [p + c.text for p, c in zip(prompts, plain.choices, strict=True)]
    assert [c.text for c in echoed.choices] == expected
    assert echoed.usage == plain.usage  # the prompt is not counted again
    chunks = list(client.completions.create(model="llm", prompt=prompts, temperature=0, max_tokens=4,
                                            echo=True, stream=True))  # fmt: skip
    firsts = {}
    for c in chunks:
        firsts.setdefault(c.choices[0].index, c.choices[0].text)
    assert firsts[0].startswith(prompts[0]) and firsts[1].startswith(prompts[1])
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)]
    assert streamed == [c.text for c in echoed.choices]


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI) -> None:
    # lm-evaluation-harness's loglikelihood request (its local-completions model): echo, logprobs
    # 1, max_tokens 1, temperature 0, and a batch of prompts. It reads each prompt token's logprob.
    texts = ["The capital of France is Paris", "The capital of Italy is Rome"]
    scored = client.completions.create(model="llm", prompt=texts, temperature=0, max_tokens=1, logprobs=1,
                                       echo=True)  # fmt: skip
    alone = [client.completions.create(model="llm", prompt=t, temperature=0, max_tokens=0, echo=True,
                                       logprobs=1) for t in texts]  # fmt: skip
    for text, choice, only in zip(texts, scored.choices, alone, strict=True):
        lp, n = choice.logprobs, only.usage.prompt_tokens
        assert len(lp.tokens) == n + 1, lp  # the prompt's tokens, then the one generated
        assert "".join(lp.tokens[:n]) == text and choice.text == text + lp.tokens[n]
        # Nothing predicts the first token: null, as vLLM reports it.
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(x < 0 for x in lp.token_logprobs[1:]) and all(len(t) == 1 for t in lp.top_logprobs[1:])
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n + 1)]
        # max_tokens 0: the prompt alone, the same logprobs (vLLM counts the one step it ran).
        assert only.choices[0].text == text and only.choices[0].logprobs.tokens == lp.tokens[:n]
        assert only.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:n], abs=0.05)
        assert only.usage.completion_tokens == 1
    assert scored.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    # A prompt token scores as a generation scored it: " Paris" after "The capital of France is".
    context = texts[0].removesuffix(" Paris")
    made = client.completions.create(model="llm", prompt=context, temperature=0, max_tokens=1, logprobs=1)
    made_lp = made.choices[0].logprobs
    assert made_lp.tokens == [" Paris"] and scored.choices[0].logprobs.tokens[-2] == " Paris"
    assert scored.choices[0].logprobs.token_logprobs[-2] == pytest.approx(made_lp.token_logprobs[0], abs=0.05)
    # Streamed: the prompt's tokens in the first chunk, then each chunk its own, offsets running on.
    chunks = list(client.completions.create(model="llm", prompt=context, temperature=0, max_tokens=3,
                                            logprobs=1, echo=True, stream=True))  # fmt: skip
    whole = client.completions.create(model="llm", prompt=context, temperature=0, max_tokens=3, logprobs=1,
                                      echo=True).choices[0]  # fmt: skip
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert streamed[0].tokens[:5] == ["The", " capital", " of", " France", " is"]
    assert [t for s in streamed for t in s.tokens] == whole.logprobs.tokens
    assert [o for s in streamed for o in s.text_offset] == whole.logprobs.text_offset
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    # vLLM's own prompt_logprobs field (keyed by token ids) is not served; the 400 says what is.
    with pytest.raises(openai.BadRequestError, match="with echo and logprobs"):
        client.completions.create(model="llm", prompt=context, max_tokens=1,
                                  extra_body={"prompt_logprobs": 1})  # fmt: skip
    # max_tokens 0 without echo generates nothing and reports nothing: a 400, as before.
    with pytest.raises(openai.BadRequestError, match="max_tokens must be > 0"):
        client.completions.create(model="llm", prompt=context, max_tokens=0)


def test_token_id_prompts(client: openai.OpenAI, predictor: Predictor) -> None:
    # vLLM's token prompts: the model reads the ids as they are, the same as the text they encode.
    from transformers import AutoTokenizer

    from semserve import model_prep

    tokenizer = AutoTokenizer.from_pretrained(str(model_prep.prepare().model_dir))
    texts = ["The capital of France is", "The capital of Italy is"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ask = {"model": "llm", "temperature": 0, "max_tokens": 4}
    as_text = client.completions.create(**ask, prompt=texts[0])
    as_ids = client.completions.create(**ask, prompt=ids[0])
    assert as_ids.choices[0].text == as_text.choices[0].text and as_ids.usage == as_text.usage
    batch = client.completions.create(**ask, prompt=ids)
    by_text = client.completions.create(**ask, prompt=texts)
    assert [c.text for c in batch.choices] == [c.text for c in by_text.choices]
    # Echo shows the text the ids decode to; with logprobs, lm-eval's request with its defaults.
    scored = client.completions.create(**{**ask, "max_tokens": 1}, prompt=ids, echo=True, logprobs=1)
    for text, token_ids, choice in zip(texts, ids, scored.choices, strict=True):
        assert choice.text.startswith(text) and len(choice.logprobs.tokens) == len(token_ids) + 1
        assert choice.logprobs.token_logprobs[0] is None
    streamed = list(client.completions.create(**ask, prompt=ids[1], echo=True, stream=True))
    assert streamed[0].choices[0].text.startswith(texts[1])
    assert "".join(c.choices[0].text for c in streamed) == texts[1] + batch.choices[1].text
    # An id outside the vocabulary is a 400 naming the prompt, before any generation.
    r = httpx.post(f"{predictor.openai_base}/completions", json={**ask, "prompt": [1, 10**6]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert "outside the vocabulary" in r.json()["error"]["message"]
    # v2: input_ids, INT64 [B, L]; the answer as for the text, and the prompt's text beside it.
    tensor = {"name": "input_ids", "datatype": "INT64", "shape": [1, len(ids[0])], "data": ids[0]}
    body = {"inputs": [tensor], "parameters": {"max_tokens": 4, "temperature": 0}}
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=body, timeout=60)
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs["text_output"] == [as_text.choices[0].text], r.text
    assert outputs["prompt_text"] == [texts[0]]


def test_vllm_s_stop_extensions(client: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    from semserve import model_prep

    tokenizer = AutoTokenizer.from_pretrained(str(model_prep.prepare().model_dir))
    ask = {"model": "llm", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}
    plain = client.completions.create(**ask).choices[0]
    ids = tokenizer(plain.text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 3, plain
    # stop_token_ids: the generation ends at that token, left out of the text (as vLLM does).
    cut = client.completions.create(**ask, extra_body={"stop_token_ids": [ids[1]]}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == tokenizer.decode(ids[:1]), (cut, plain)
    # include_stop_str_in_output: the stop string ends the text instead of being cut from it.
    word = plain.text.split()[1]
    without = client.completions.create(**ask, stop=[word]).choices[0]
    kept = client.completions.create(**ask, stop=[word], extra_body={"include_stop_str_in_output": True})
    assert without.finish_reason == "stop" and word not in without.text, without
    assert kept.choices[0].text == without.text + word, (kept, without)
    # logit_bias: -100 bans the token the answer began with, +100 makes a token the whole answer.
    banned = client.completions.create(**ask, logit_bias={str(ids[0]): -100}).choices[0]
    assert not banned.text.startswith(tokenizer.decode(ids[:1])), (banned, plain)
    forced = client.completions.create(**ask, logit_bias={str(ids[1]): 100}).choices[0]
    assert forced.text == tokenizer.decode([ids[1]] * 8), forced
    # Known vLLM fields not honoured here are a 400 naming them, never dropped silently.
    with pytest.raises(openai.BadRequestError, match="use_beam_search is not supported"):
        client.completions.create(**ask, extra_body={"use_beam_search": True})
    client.completions.create(**ask, extra_body={"use_beam_search": False, "bad_words": []})  # defaults


def test_logprobs(client: openai.OpenAI) -> None:
    ask = {"model": "llm", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 4}
    whole = client.completions.create(**ask, logprobs=3)
    choice, lp = whole.choices[0], whole.choices[0].logprobs
    assert choice.finish_reason == "length" and len(lp.tokens) == whole.usage.completion_tokens == 4
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) in (1, 2, 3) and logprob <= 0
        assert top[token] == pytest.approx(max(top.values()))  # greedy: the most likely token
    assert client.completions.create(**ask).choices[0].logprobs is None  # only when asked
    assert client.completions.create(**ask, logprobs=0).choices[0].logprobs.top_logprobs == [{}] * 4
    # Streamed: the same tokens, each chunk its own, offsets running on.
    chunks = list(client.completions.create(**ask, logprobs=3, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    # Chat: logprobs and top_logprobs, OpenAI's shape (bytes included).
    chat = client.chat.completions.create(model="llm", messages=QUESTION, temperature=0, max_tokens=6,
                                          logprobs=True, top_logprobs=2)  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(t.bytes == list(t.token.encode()) and 1 <= len(t.top_logprobs) <= 2 for t in content)
    assert chat.choices[0].message.content.startswith("".join(t.token for t in content[:3]))
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs: true"):
        client.chat.completions.create(model="llm", messages=QUESTION, max_tokens=2, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="logprobs must be in"):
        client.completions.create(**ask, logprobs=21)


def test_structured_outputs(client: openai.OpenAI, predictor: Predictor) -> None:
    # OpenAI's response_format with a JSON schema: the answer parses and holds what the schema requires.
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    answer = client.chat.completions.create(
        model="llm", messages=QUESTION, temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}})
    assert answer.choices[0].finish_reason == "stop", answer
    assert isinstance(json.loads(answer.choices[0].message.content)["city"], str)
    # vLLM's own fields, and its older guided_* names, on completions too.
    yes_no = {"structured_outputs": {"choice": ["yes", "no"]}}
    choice = client.completions.create(model="llm", prompt="Is Paris in France? Answer:", temperature=0,
                                       max_tokens=4, extra_body=yes_no)  # fmt: skip
    assert choice.choices[0].text in ("yes", "no"), choice
    digits = client.completions.create(model="llm", prompt="Pick a number:", temperature=0, max_tokens=6,
                                       extra_body={"guided_regex": "[0-9]{3}"})  # fmt: skip
    assert re.fullmatch("[0-9]{3}", digits.choices[0].text), digits
    # v2: the structured_outputs parameter, as JSON in a string.
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", timeout=60, json={
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["Pick a number:"]}],
        "parameters": {"structured_outputs": json.dumps({"regex": "[0-9]{2}"}), "max_tokens": 5,
                       "temperature": 0}})  # fmt: skip
    assert r.status_code == 200, r.text
    [text] = next(o["data"] for o in r.json()["outputs"] if o["name"] == "text_output")
    assert re.fullmatch("[0-9]{2}", text), text
    with pytest.raises(openai.BadRequestError, match="response_format type 'xml' is not supported"):
        client.chat.completions.create(model="llm", messages=QUESTION, response_format={"type": "xml"})


WEATHER = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now"}},
]
GET_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def test_tool_calls(client: openai.OpenAI) -> None:
    # A named function: the model's text is that call's arguments, in the schema of its parameters.
    ask = {"model": "llm", "messages": WEATHER, "tools": TOOLS, "temperature": 0}
    named = client.chat.completions.create(**ask, tool_choice=GET_WEATHER, max_tokens=40)
    [choice] = named.choices
    assert choice.finish_reason == "stop" and choice.message.content is None, named
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("chatcmpl-tool-")
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # "required": the model picks among the tools (one call, as parallel_tool_calls is false) and
    # the choice finishes with "tool_calls", as OpenAI's does.
    required = client.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False,
                                              max_tokens=60)  # fmt: skip
    [choice] = required.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, required
    [call] = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)
    # "none": the tools only reach the chat template, the answer is text.
    text = client.chat.completions.create(model="llm", messages=QUESTION, tools=TOOLS, tool_choice="none",
                                          temperature=0, max_tokens=12)  # fmt: skip
    assert text.choices[0].message.content and text.choices[0].message.tool_calls is None


def test_tool_calls_streamed(client: openai.OpenAI) -> None:
    # A named call's arguments stream as the model writes them: the first delta opens the call (id,
    # name), the next ones carry arguments only; together they are the whole answer's arguments.
    ask = {"model": "llm", "messages": WEATHER, "tools": TOOLS, "tool_choice": GET_WEATHER, "temperature": 0,
           "max_tokens": 40}  # fmt: skip
    whole = client.chat.completions.create(**ask).choices[0].message.tool_calls[0]
    deltas = [c.choices[0].delta.tool_calls for c in client.chat.completions.create(**ask, stream=True)
              if c.choices and c.choices[0].delta.tool_calls]  # fmt: skip
    assert len(deltas) > 1
    assert deltas[0][0].id and deltas[0][0].function.name == "get_weather"
    assert all(d[0].id is None and d[0].function.name is None for d in deltas[1:])
    assert "".join(d[0].function.arguments for d in deltas) == whole.function.arguments
    # "required" calls are parsed once whole: they come in one chunk, before the finish.
    # (One call at most, with room to finish it: several calls may not fit in max_tokens.)
    chunks = list(client.chat.completions.create(**{**ask, "tool_choice": "required", "max_tokens": 60},
                                                 parallel_tool_calls=False, stream=True))  # fmt: skip
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].function.name in ("get_weather", "get_time"), chunks
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_results_in_the_history(client: openai.OpenAI) -> None:
    # A conversation that called a tool and has its result goes on, as the openai client writes it.
    arguments = '{"city": "Paris"}'
    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [*WEATHER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1", "content": "Sunny, 21 C"},
                {"role": "user", "content": "So, is it sunny?"}]  # fmt: skip
    answer = client.chat.completions.create(model="llm", messages=messages, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=12)  # fmt: skip
    assert answer.choices[0].message.content, answer


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"tools": TOOLS}, 'tool_choice "auto" (the default with tools) needs a parser'),
        ({"tools": TOOLS, "tool_choice": "auto"}, "needs a parser of the model's own tool-call format"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}},
         "tool_choice names 'fly', which is not in tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format and tool_choice both constrain the output"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}], "tool_choice": "none"},
         "tools.0.function.name"),
        ({"tools": [TOOLS[1], TOOLS[1]], "tool_choice": "required"}, "tools name a function twice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"x": {"type": "frobnicate"}}}}}], "tool_choice": "required"},
         "Invalid type: frobnicate"),
    ],
)
def test_tool_errors(predictor: Predictor, fields: dict, needle: str) -> None:
    body = {"model": "llm", "messages": WEATHER, "max_tokens": 8, **fields}
    r = httpx.post(f"{predictor.openai_base}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
