"""Every bad v2 REST input gets a 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Predictor


def tensor(data: list, datatype: str = "BYTES", shape: list | None = None, name: str = "text_input"):
    return {"name": name, "datatype": datatype, "shape": shape if shape is not None else [len(data)],
            "data": data}


CASES = [
    ({"inputs": []}, 400, "text_input"),
    ({"inputs": [tensor(["hi"], name="prompt")]}, 400, "unknown input"),
    ({"inputs": [tensor([1, 2], datatype="INT32")]}, 400, "BYTES"),
    ({"inputs": [tensor(["a", "b"], shape=[3])]}, 400, "shape"),
    ({"inputs": [tensor(["a"], shape=[1, 2])]}, 400, "shape"),
    ({"inputs": [tensor([""])]}, 400, "empty"),
    ({"inputs": [tensor(["nul\u0000byte"])]}, 400, "NUL"),
    ({"inputs": [tensor(["word " * 3000])]}, 400, "context"),
    ({"inputs": [tensor(["hi"])], "parameters": {"max_tokens": 0}}, 400, "max_tokens"),
    ({"inputs": [tensor(["hi"])], "parameters": {"max_tokens": 99999}}, 400, "max_tokens"),
    ({"inputs": [tensor(["hi"])], "parameters": {"temperature": -1}}, 400, "temperature"),
    ({"inputs": [tensor(["hi"])], "parameters": {"top_p": 0}}, 400, "top_p"),
    ({"inputs": [tensor(["hi"])], "parameters": {"max_tokens": "many"}}, 400, "max_tokens"),
    ({"inputs": [tensor(["hi"] * 65)]}, 400, "at most"),
    ({"inputs": [tensor(["hi"]), tensor(["{bad json"], name="sampling_parameters")]}, 400, "JSON"),
    ({"inputs": "nope"}, 400, "inputs"),
]


@pytest.mark.parametrize(("body", "status", "needle"), CASES)
def test_v2_bad_input(predictor: Predictor, body: dict, status: int, needle: str) -> None:
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.text


def test_unknown_model_is_404(predictor: Predictor) -> None:
    r = httpx.post(f"{predictor.http}/v2/models/other/infer", json={"inputs": [tensor(["hi"])]})
    assert r.status_code == 404 and "other" in r.text


def test_malformed_json_is_400(predictor: Predictor) -> None:
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", content=b'{"inputs": [',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


def test_oversized_body_is_413(predictor: Predictor) -> None:
    # The suite runs the predictor with a 256 KiB limit.
    big = {"inputs": [tensor(["x" * (300 * 1024)])]}
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=big, timeout=60)
    assert r.status_code == 413 and "limit" in r.text


def test_invalid_utf8_in_binary_tensor_is_400(predictor: Predictor) -> None:
    # The v2 binary extension: JSON header, then the raw BYTES tensor (4-byte length + bytes).
    raw = b"\xff\xfe\xfd"
    payload = len(raw).to_bytes(4, "little") + raw
    header = (
        b'{"inputs":[{"name":"text_input","datatype":"BYTES","shape":[1],'
        b'"parameters":{"binary_data_size":' + str(len(payload)).encode() + b"}}]}"
    )
    r = httpx.post(
        f"{predictor.http}/v2/models/llm/infer",
        content=header + payload,
        headers={
            "content-type": "application/octet-stream",
            "inference-header-content-length": str(len(header)),
        },
    )
    assert r.status_code == 400 and "UTF-8" in r.text, r.text


def test_server_still_serves_after_bad_inputs(predictor: Predictor) -> None:
    r = httpx.post(f"{predictor.http}/v2/models/llm/infer",
                   json={"inputs": [tensor(["Hello"])], "parameters": {"max_tokens": 2}}, timeout=60)
    assert r.status_code == 200
