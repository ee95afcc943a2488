"""What a Triton user's tritonclient sends beyond its defaults, against both services: JSON bodies
with no content type (or the asyncio client's octet-stream), request bodies compressed with gzip
or deflate, requested output subsets over HTTP, gRPC and a stream, and the 400s for an output the
model lacks and for a model version. The client runs in a process of its own (its protobuf
package cannot share one with KServe's: tests/clients/triton_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FRANCE, Predictor, Transformer

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "triton_check.py"


@pytest.fixture(scope="module", params=["predictor", "transformer"])
def cases(request: pytest.FixtureRequest) -> dict[str, Any]:
    server: Predictor | Transformer = request.getfixturevalue(request.param)
    done = subprocess.run(
        [sys.executable, str(CLIENT), "wire", server.grpc, server.http.removeprefix("http://"),
         json.dumps({"prompt": FRANCE})],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def outputs(cases: dict[str, Any], name: str) -> dict[str, list[Any]]:
    case = cases[name]
    assert "outputs" in case, f"{name}: {case}"
    return case["outputs"]


@pytest.mark.parametrize(
    "name", ["json_all_outputs", "aio_json", "aio_binary", "aio_json_gzip", "gzip", "deflate"]
)
def test_json_and_compressed_bodies_get_the_answer(cases: dict[str, Any], name: str) -> None:
    got = outputs(cases, name)
    assert "Paris" in got["text_output"][0]
    assert got["finish_reason"][0] in ("stop", "length") and got["completion_tokens"][0] > 0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("json", ["text_output", "finish_reason"]),
        ("http_subset", ["finish_reason"]),
        ("grpc_subset", ["text_output", "finish_reason"]),
        ("stream_subset", ["finish_reason"]),
    ],
)
def test_only_the_requested_outputs_come_back(cases: dict[str, Any], name: str, expected: list[str]) -> None:
    assert sorted(outputs(cases, name)) == sorted(expected)


@pytest.mark.parametrize(("name", "status"), [("http_unknown_output", "[400]"),
                                              ("grpc_unknown_output", "[StatusCode.INVALID_ARGUMENT]")])
def test_an_output_the_model_lacks_is_named_in_a_400(cases: dict[str, Any], name: str, status: str) -> None:
    error = cases[name].get("error", "")
    assert error.startswith(status), cases[name]
    assert "unknown output 'logits' requested" in error and "'text_output'" in error


def test_a_model_version_is_refused_over_grpc_as_over_rest(cases: dict[str, Any]) -> None:
    error = cases["grpc_version"].get("error", "")
    assert error.startswith("[StatusCode.INVALID_ARGUMENT]"), cases["grpc_version"]
    assert "Model versioning not supported" in error
