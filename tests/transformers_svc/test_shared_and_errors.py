"""Through a real transformer: identical concurrent requests answered by one generation report
`shared` (headers, v2 cache_status, the request-duration metric), unary and streamed; and an
oversized chat on the OpenAI route names `messages`, not the predictor's v2 input."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.conftest import Transformer
from tests.support import metric_value

N = 4
# A generation that lasts (ignore_eos): a raw prompt often ends at its first token, and on a fast
# machine a one-token generation is stored before the other requests' lookups end, which then find
# it by KNN (`semantic`) instead of joining it.
BODY = {"max_tokens": 32, "temperature": 0, "ignore_eos": True}


def _fresh(text: str) -> str:
    return f"{text} (ref {uuid.uuid4().hex[:8]})"


def _together(call: Any, n: int = N) -> list[str]:
    """`call(client)` n times at once (one client made beforehand: making one takes long enough to
    stagger the requests)."""
    barrier = threading.Barrier(n)
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(n) as pool:

        def go(_: int) -> str:
            barrier.wait()
            return call(client)

        return list(pool.map(go, range(n)))


def _shared_seconds(t: Transformer, protocol: str) -> float:
    text = httpx.get(f"{t.http}/metrics", timeout=10).text
    return metric_value(text, "semserve_transformer_request_duration_seconds_count",
                        protocol=protocol, cache="shared")  # fmt: skip


def _check(statuses: list[str]) -> None:
    # One generation: its leader missed; the others joined it (or, arriving after its store, hit).
    assert statuses.count("miss") == 1 and "shared" in statuses, statuses
    assert set(statuses) <= {"miss", "shared", "exact"}, statuses


def test_concurrent_identical_openai_chats_are_shared(transformer: Transformer) -> None:
    before = _shared_seconds(transformer, "openai")
    body = {"model": "llm", "messages": [{"role": "user", "content": _fresh("Name three rivers.")}], **BODY}

    def ask(client: httpx.Client) -> str:
        r = client.post(f"{transformer.openai_base}/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.headers["x-semserve-cache"]

    _check(_together(ask))
    assert _shared_seconds(transformer, "openai") > before


def test_concurrent_identical_streams_are_shared(transformer: Transformer) -> None:
    prompt = _fresh("Name three mountains.")

    def openai_stream(client: httpx.Client) -> str:
        body = {"model": "llm", "prompt": prompt, "stream": True, **BODY}
        with client.stream("POST", f"{transformer.openai_base}/completions", json=body) as s:
            assert s.status_code == 200
            list(s.iter_lines())
            return s.headers["x-semserve-cache"]

    _check(_together(openai_stream))

    other = _fresh("Name three lakes.")

    def generate_stream(client: httpx.Client) -> str:
        body = {"text_input": other, "parameters": BODY}
        with client.stream("POST", f"{transformer.http}/v2/models/llm/generate_stream", json=body) as s:
            assert s.status_code == 200
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        [status] = {e["cache_status"] for e in events}
        return status

    _check(_together(generate_stream))


def test_concurrent_identical_v2_requests_are_shared(transformer: Transformer) -> None:
    prompt = _fresh("Name three forests.")
    body = {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
        "parameters": BODY,
    }

    def ask(client: httpx.Client) -> str:
        r = client.post(f"{transformer.http}/v2/models/llm/infer", json=body)
        assert r.status_code == 200, r.text
        [status] = next(o["data"] for o in r.json()["outputs"] if o["name"] == "cache_status")
        return status

    _check(_together(ask))


def test_an_oversized_chat_names_messages(transformer: Transformer) -> None:
    long = " ".join(["word"] * 5000)  # past the model's context (2048 tokens)
    for stream in (False, True):
        r = httpx.post(f"{transformer.openai_base}/chat/completions", timeout=120, json={
            "model": "llm", "messages": [{"role": "user", "content": _fresh(long)}], "stream": stream,
            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages" and "chat[" not in error["message"], error
