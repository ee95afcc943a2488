"""The OpenAI base URL: the route prefix is a setting, a request under a habitual wrong base URL
(vLLM's `/v1`, a base URL without `/v1`) gets a 404 naming the right one, and CORS is opt-in."""

from __future__ import annotations

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
    for wrong in (f"{predictor.http}/v1", f"{predictor.http}/openai"):
        client = openai.OpenAI(base_url=wrong, api_key="unused", max_retries=0)
        # Before: KServe's v1 model list answered, and the client silently listed no model.
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


@pytest.fixture
def vllm_style_server() -> Iterator[str]:
    """A real HTTP server with the OpenAI routes at prefix "" (as vLLM serves them) and CORS for
    one origin."""
    app = FastAPI()
    register_openai_routes(app, _OneModel(), prefix="")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(with_cors(app, ["http://localhost:3000"]), port=port,
                                           log_level="warning"))  # fmt: skip
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
