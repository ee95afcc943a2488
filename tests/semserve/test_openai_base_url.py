"""The OpenAI base URL: the route prefix is a setting; with the default one the routes are also at
vLLM's `/v1`; a request under a habitual wrong base URL (a base URL without `/v1`, or `/openai/v1`
where another prefix is configured) gets a 404 naming the right one; CORS is opt-in."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI

from predictors.config import PredictorSettings
from semserve.errors import NotFound
from semserve.openai_protocol import OpenAIModelCard
from semserve.openai_routes import register_openai_routes, with_cors
from tests.conftest import Predictor
from tests.support import free_port


def test_wrong_base_url_names_the_right_one(predictor: Predictor) -> None:
    right = f"{predictor.http}/openai/v1"
    wrong = f"{predictor.http}/openai"  # the base URL without /v1
    client = openai.OpenAI(base_url=wrong, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as listed:
        client.models.list()
    assert right in str(listed.value), listed.value
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(
            model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert right in str(chat.value) and "/chat/completions" in str(chat.value)
    ok = openai.OpenAI(base_url=right, api_key="unused", max_retries=0)
    assert [m.id for m in ok.models.list()] == ["llm"]


@pytest.fixture(params=["predictor", "transformer"])
def service(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(request.param).http


def test_v1_is_an_alias_of_openai_v1(service: str) -> None:
    """vLLM's base URL works too with the default prefix (it answered a 404 before): the same
    models, chat and completions as under /openai/v1."""
    alias = openai.OpenAI(base_url=f"{service}/v1", api_key="unused", max_retries=0)
    main = openai.OpenAI(base_url=f"{service}/openai/v1", api_key="unused", max_retries=0)
    assert [m.id for m in alias.models.list()] == [m.id for m in main.models.list()] == ["llm"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = alias.chat.completions.create(model="llm", messages=messages, max_tokens=4, temperature=0)
    same = main.chat.completions.create(model="llm", messages=messages, max_tokens=4, temperature=0)
    assert chat.choices[0].message.content == same.choices[0].message.content
    assert chat.choices[0].message.content
    text = alias.completions.create(model="llm", prompt="The capital of France is", max_tokens=3,
                                    temperature=0)  # fmt: skip
    assert text.choices[0].text
    streamed = alias.chat.completions.create(model="llm", messages=messages, max_tokens=4,
                                             temperature=0, stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == same.choices[
        0].message.content  # fmt: skip
    # KServe's v1 model-ready route keeps its path.
    ready = httpx.get(f"{service}/v1/models/llm", timeout=30)
    assert ready.status_code == 200 and ready.json().get("ready") is True, ready.text


def test_prefix_and_cors_settings_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSERVE_PREDICTOR_OPENAI_ROUTE_PREFIX", "/")  # vLLM's /v1
    monkeypatch.setenv("SEMSERVE_PREDICTOR_CORS_ALLOWED_ORIGINS", "http://localhost:3000/, https://a.b")
    s = PredictorSettings.from_env()
    assert s.openai_route_prefix == "" and s.cors_origins == ["http://localhost:3000", "https://a.b"]
    assert PredictorSettings(openai_route_prefix="llm/").openai_route_prefix == "/llm"
    with pytest.raises(ValueError, match="before /v1"):
        PredictorSettings(openai_route_prefix="/openai/v1")


class _OneModel:
    """The route layer's backend contract with one model and no generation: what these tests
    exercise is the routing and the headers, which live in semserve/openai_routes.py."""

    def models(self) -> list[OpenAIModelCard]:
        return [OpenAIModelCard(id="llm", object="model", created=1, owned_by="semserve")]

    async def completions(self, req: Any, ctx: Any) -> Any:
        raise NotFound("no generation in this test server", "model")

    chat_completions = completions


@contextlib.contextmanager
def _routes_server(prefix: str, cors: list[str]) -> Iterator[str]:
    """A real HTTP server with the OpenAI routes at `prefix` and CORS for `cors`."""
    app = FastAPI()
    register_openai_routes(app, _OneModel(), prefix=prefix)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(with_cors(app, cors), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def vllm_style_server() -> Iterator[str]:
    """The OpenAI routes at prefix "" (as vLLM serves them) and CORS for one origin."""
    with _routes_server("", ["http://localhost:3000"]) as base:
        yield base


def test_configured_prefix_is_the_only_one() -> None:
    with _routes_server("/llm", []) as base:
        ok = openai.OpenAI(base_url=f"{base}/llm/v1", api_key="unused", max_retries=0)
        assert [m.id for m in ok.models.list()] == ["llm"]
        for wrong in (f"{base}/v1", f"{base}/openai/v1", f"{base}/llm"):
            client = openai.OpenAI(base_url=wrong, api_key="unused", max_retries=0)
            with pytest.raises(openai.NotFoundError) as err:
                client.models.list()
            assert f"{base}/llm/v1" in str(err.value), (wrong, err.value)


def test_empty_prefix_serves_vllm_base_url(vllm_style_server: str) -> None:
    client = openai.OpenAI(base_url=f"{vllm_style_server}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["llm"]
    kserve_style = openai.OpenAI(base_url=f"{vllm_style_server}/openai/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        kserve_style.models.list()
    assert f"{vllm_style_server}/v1" in str(err.value)


def test_cors_for_allowed_origin_only(vllm_style_server: str) -> None:
    preflight = {"origin": "http://localhost:3000", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization,content-type"}  # fmt: skip
    r = httpx.options(f"{vllm_style_server}/v1/chat/completions", headers=preflight)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    listed = httpx.get(f"{vllm_style_server}/v1/models", headers={"origin": "http://localhost:3000"})
    assert listed.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-semserve-cache" in listed.headers["access-control-expose-headers"]
    other = httpx.get(f"{vllm_style_server}/v1/models", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default() -> None:
    app = FastAPI()
    assert with_cors(app, PredictorSettings().cors_origins) is app
