"""Request bodies sent with Content-Encoding gzip or deflate (tritonclient's
request_compression_algorithm; any HTTP client may): decoded before any route reads them, with the
body limit held on the decoded size; an unknown coding is a 415 and a broken stream a 400, naming
the problem. The decoder alone, then both real services over HTTP."""

from __future__ import annotations

import gzip
import json
import zlib

import httpx
import pytest

from semserve.serving.content_encoding import EncodingError, decode_body
from tests.conftest import FRANCE, Predictor, Transformer

BODY = b'{"inputs": [], "note": "' + b"x" * 300 + b'"}'
LIMIT = 4096


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encoded", "header"),
    [
        (gzip.compress(BODY), "gzip"),
        (gzip.compress(BODY), "GZIP"),
        (zlib.compress(BODY), "deflate"),  # what HTTP's "deflate" means: zlib framing
        (raw_deflate(BODY), "deflate"),  # what some clients send under that name
        (BODY, "identity"),
        (gzip.compress(BODY), "gzip, identity"),
        (gzip.compress(zlib.compress(BODY)), "deflate, gzip"),  # applied in that order, undone last first
    ],
)
def test_decoded(encoded: bytes, header: str) -> None:
    assert decode_body(encoded, header, LIMIT) == BODY


@pytest.mark.parametrize(
    ("encoded", "header", "status", "message"),
    [
        (BODY, "br", 415, "content-encoding 'br' is not supported (send gzip, deflate or identity)"),
        (gzip.compress(BODY), "gzip, zstd", 415, "content-encoding 'zstd' is not supported"),
        (BODY, "gzip", 400, "request body is not valid gzip data"),
        (BODY, "deflate", 400, "request body is not valid deflate data"),
        (gzip.compress(BODY)[:-12], "gzip", 400, "request body is a truncated gzip stream"),
        (gzip.compress(BODY) + b"junk", "gzip", 400, "request body has data after its gzip stream"),
        (gzip.compress(b" " * (LIMIT + 1)), "gzip", 413,
         f"larger than the limit of {LIMIT} bytes once decoded"),
    ],
)
def test_refused(encoded: bytes, header: str, status: int, message: str) -> None:
    with pytest.raises(EncodingError) as caught:
        decode_body(encoded, header, LIMIT)
    assert caught.value.status == status
    assert message in str(caught.value)


def test_a_body_of_exactly_the_limit_is_decoded() -> None:
    assert decode_body(gzip.compress(b"a" * LIMIT), "gzip", LIMIT) == b"a" * LIMIT


@pytest.fixture(params=["predictor", "transformer"])
def service(request: pytest.FixtureRequest) -> str:
    server: Predictor | Transformer = request.getfixturevalue(request.param)
    return server.http


CHAT = json.dumps({
    "model": "llm", "temperature": 0, "max_tokens": 8,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}).encode()
V2 = json.dumps({
    "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [FRANCE]}],
    "parameters": {"temperature": 0, "max_tokens": 8},
}).encode()


@pytest.mark.parametrize(
    ("path", "body"), [("/openai/v1/chat/completions", CHAT), ("/v2/models/llm/infer", V2)]
)
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compressed_request_gets_the_plain_request_s_answer(
    service: str, path: str, body: bytes, coding: str
) -> None:
    plain = httpx.post(f"{service}{path}", content=body, headers={"content-type": "application/json"},
                       timeout=120)  # fmt: skip
    encoded = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
    headers = {"content-type": "application/json", "content-encoding": coding}
    compressed = httpx.post(f"{service}{path}", content=encoded, headers=headers, timeout=120)
    assert plain.status_code == compressed.status_code == 200, compressed.text
    if path.startswith("/v2"):
        assert compressed.json()["outputs"][0]["data"] == plain.json()["outputs"][0]["data"]
    else:
        assert compressed.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


@pytest.mark.parametrize(
    ("encoded", "coding", "status", "message"),
    [
        (CHAT, "br", 415, "content-encoding 'br' is not supported"),
        (CHAT, "gzip", 400, "request body is not valid gzip data"),
        (gzip.compress(CHAT)[:-12], "gzip", 400, "truncated gzip stream"),
        # 64 MiB of spaces in 64 KiB: the decoded size is held to the body limit.
        (gzip.compress(b" " * (64 * 1024 * 1024)), "gzip", 413, "once decoded"),
    ],
)
def test_a_body_that_cannot_be_decoded_is_a_4xx_naming_why(
    service: str, encoded: bytes, coding: str, status: int, message: str
) -> None:
    r = httpx.post(f"{service}/openai/v1/chat/completions", content=encoded, timeout=60,
                   headers={"content-type": "application/json", "content-encoding": coding})  # fmt: skip
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert r.headers["x-request-id"]
