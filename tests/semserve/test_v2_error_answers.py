"""Error answers of the v2 routes on both services, from the one error table: a body that is not
JSON names where and what is wrong, and binary tensor data without its header says which header."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Predictor, Transformer

BAD_JSON = b'{"inputs": [1 2]}'
BAD_JSON_ERROR = "invalid JSON at line 1 column 15 (char 14): Expecting ',' delimiter"


@pytest.fixture(params=["predictor", "transformer"])
def service(request: pytest.FixtureRequest) -> str:
    server: Predictor | Transformer = request.getfixturevalue(request.param)
    return server.http


@pytest.mark.parametrize("route", ["infer", "generate", "generate_stream"])
def test_malformed_json_names_position_and_problem(service: str, route: str) -> None:
    r = httpx.post(f"{service}/v2/models/llm/{route}", content=BAD_JSON,
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json() == {"error": BAD_JSON_ERROR}


def test_multiline_json_error_names_the_line(service: str) -> None:
    body = b'{\n  "inputs": [\n    {"name": "text_input",}\n  ]\n}'
    r = httpx.post(f"{service}/v2/models/llm/infer", content=body,
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("invalid JSON at line 3 column 27 (char 42): Expecting property name")


def test_binary_body_without_its_header_names_the_header(service: str) -> None:
    r = httpx.post(f"{service}/v2/models/llm/infer", content=b"\x00\x01binary",
                   headers={"content-type": "application/octet-stream"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "the 'inference-header-content-length' header is missing" in error, error
    assert "the'" not in error
