"""semserve's own v2 REST infer route (semserve/v2/rest_infer.py) answers exactly as KServe's route:
two real transformers on one cache index, one with the route (the default) and one with
--no-v2-fast-path, get the same requests; statuses, bodies and headers must agree."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Predictor, Transformer, start_transformer

MODEL = "llm"
HEADERS = {"x-request-id": "route-compare"}


@pytest.fixture(scope="module")
def pair(predictor: Predictor, redis_url: str) -> Iterator[tuple[Transformer, Transformer]]:
    owned = start_transformer("route_on", predictor.grpc, redis_url)
    try:
        # The same index (the last --cache-deployment wins): the hits the first stores are the second's.
        kserve_route = start_transformer("route_off", predictor.grpc, redis_url,
                                         "--cache-deployment", "route_on", "--no-v2-fast-path")  # fmt: skip
    except BaseException:
        owned.process.stop()
        raise
    try:
        yield owned, kserve_route
    finally:
        owned.process.stop()
        kserve_route.process.stop()


def tensor(data: list[Any], name: str = "text_input", datatype: str = "BYTES",
           shape: list[Any] | None = None) -> dict[str, Any]:  # fmt: skip
    shape = [len(data)] if shape is None else shape
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def body(*prompts: str, **extra: Any) -> bytes:
    return json.dumps({"inputs": [tensor(list(prompts))], "parameters": {"max_tokens": 4, "temperature": 0},
                       **extra}).encode()  # fmt: skip


def _post(base: str, content: bytes, headers: dict[str, str], model: str = MODEL) -> httpx.Response:
    return httpx.post(f"{base}/v2/models/{model}/infer", content=content,
                      headers={**HEADERS, **headers}, timeout=120)  # fmt: skip


def _same(owned: Transformer, kserve_route: Transformer, content: bytes,
          headers: dict[str, str] | None = None, model: str = MODEL) -> httpx.Response:  # fmt: skip
    headers = {"content-type": "application/json", **(headers or {})}
    headers = {k: v for k, v in headers.items() if v}  # "": the header left out
    # A request either route answers with a generation is stored by the first: both compared as hits.
    _post(kserve_route.http, content, headers, model)
    a = _post(owned.http, content, headers, model)
    b = _post(kserve_route.http, content, headers, model)
    assert a.status_code == b.status_code, (a.text, b.text)
    if a.status_code == 200:
        assert a.content == b.content
        drop = {"date", "traceresponse"}
        assert {k: v for k, v in a.headers.items() if k not in drop} == {
            k: v for k, v in b.headers.items() if k not in drop
        }
    else:
        assert a.json() == b.json()
    return a


def test_hits_are_answered_alike(pair: tuple[Transformer, Transformer]) -> None:
    owned, kserve_route = pair
    prompts = ("What is the capital of France?", "Name a primary colour.")
    for content in (body(prompts[0]), body(*prompts), body(prompts[0], id="my-id")):
        r = _same(owned, kserve_route, content)
        statuses = next(o["data"] for o in r.json()["outputs"] if o["name"] == "cache_status")
        assert set(statuses) == {"exact"}
    prompt = json.dumps({"messages": [{"role": "user", "content": "Hi!"}]})
    params = {"max_tokens": 3, "temperature": 0}
    chat = json.dumps({"inputs": [tensor([prompt], name="chat")], "parameters": params}).encode()
    _same(owned, kserve_route, chat)


GREEDY = {"temperature": 0, "max_tokens": 4}
# Bodies the owned route leaves to KServe's (some KServe answers, with a generation: then compared
# as hits), and bad ones: the same status and error either way.
BAD = [
    (b'{"inputs": [1 2]}', {}),  # invalid JSON
    (b"", {}),
    (b"[]", {}),
    (json.dumps({"inputs": []}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"], name="prompt")]}).encode(), {}),
    (json.dumps({"inputs": [tensor([1], datatype="INT32")]}).encode(), {}),
    (json.dumps({"inputs": [tensor(["a", "b"], shape=[3])]}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"], shape=["1"])], "parameters": GREEDY}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"], datatype="FP16")]}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"])], "parameters": {"max_tokens": 0}}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"])], "parameters": {"stop": ["a"]}}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"])], "outputs": [{"name": "text_output"}],
                 "parameters": GREEDY}).encode(), {}),
    (json.dumps({"inputs": [tensor(["hi"])], "id": 5}).encode(), {}),
    (json.dumps({"inputs": "nope"}).encode(), {}),
    # Without the binary extension's header a body is JSON whatever its content type (Triton's
    # reading; tritonclient sends JSON with none, its asyncio client as octet-stream).
    (body("hi"), {"content-type": "text/plain"}),
    (body("hi"), {"content-type": ""}),
    (body("hi"), {"content-type": "application/octet-stream"}),
    (json.dumps({"inputs": "nope"}).encode(), {"content-type": ""}),
    (b"\x00\x01binary", {"content-type": "application/octet-stream"}),
    (json.dumps({"inputs": [tensor(["hi"])], "outputs": [{"name": "logits"}],
                 "parameters": GREEDY}).encode(), {}),
    (body("hi"), {"inference-header-content-length": "x"}),
]


@pytest.mark.parametrize(("content", "headers"), BAD)
def test_bad_requests_are_answered_alike(pair: tuple[Transformer, Transformer], content: bytes,
                                         headers: dict[str, str]) -> None:  # fmt: skip
    owned, kserve_route = pair
    r = _same(owned, kserve_route, content, headers)
    assert r.status_code < 500, r.text


def test_other_model_is_kserve_404(pair: tuple[Transformer, Transformer]) -> None:
    owned, kserve_route = pair
    r = _same(owned, kserve_route, body("hi"), model="no-such-model")
    assert r.status_code == 404
