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


def run_client(scenario: str, server: Predictor | Transformer, prompt: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), scenario, server.grpc, server.http.removeprefix("http://"),
         json.dumps({"prompt": prompt})],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module", params=["predictor", "transformer"])
def cases(request: pytest.FixtureRequest) -> dict[str, Any]:
    return run_client("wire", request.getfixturevalue(request.param), FRANCE)


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


@pytest.fixture(scope="module", params=["predictor", "transformer"])
def extensions(request: pytest.FixtureRequest) -> dict[str, Any]:
    prompt = f"{FRANCE} (extensions {request.param})"  # a prompt of its own: a miss, then a hit
    found = run_client("extensions", request.getfixturevalue(request.param), prompt)
    return {"server": request.param, **found}


def test_server_metadata_lists_the_extensions(extensions: dict[str, Any]) -> None:
    for server in (extensions["http_server"], extensions["grpc_server"]):
        served = set(server["extensions"])
        assert {"model_configuration", "statistics", "generate", "binary_tensor_data"} <= served


def test_the_repository_index_has_the_model_ready(extensions: dict[str, Any]) -> None:
    ready = {"name": "llm", "version": "", "state": "READY", "reason": ""}
    assert ready in extensions["http_index"]
    # gRPC's JSON leaves out empty strings.
    assert {"name": "llm", "state": "READY"} in extensions["grpc_index"]["models"]


def test_model_config_says_the_text_contract_as_triton_s_vllm_backend(extensions: dict[str, Any]) -> None:
    http = extensions["http_config"]
    # gRPC's JSON is protobuf's (64-bit dims as strings, defaults left out); the same config.
    grpc = extensions["grpc_config"]["config"]
    assert http["name"] == grpc["name"] == "llm"
    assert http["backend"] == grpc["backend"] == ("vllm" if extensions["server"] == "predictor" else "python")
    assert http["max_batch_size"] == 0 and "max_batch_size" not in grpc
    assert http["model_transaction_policy"] == grpc["model_transaction_policy"] == {"decoupled": True}
    inputs = {i["name"]: i for i in http["input"]}
    assert inputs["text_input"] == {"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1],
                                    "optional": False}
    assert inputs["stream"]["data_type"] == "TYPE_BOOL" and inputs["stream"]["optional"] is True
    assert {i["name"] for i in grpc["input"]} == set(inputs)
    outputs = {o["name"]: o["data_type"] for o in http["output"]}
    assert outputs["text_output"] == "TYPE_STRING" and outputs["completion_tokens"] == "TYPE_INT32"
    assert [o["name"] for o in grpc["output"]] == [o["name"] for o in http["output"]]


def test_statistics_count_what_was_answered(extensions: dict[str, Any]) -> None:
    def counts(when: str, protocol: str) -> dict[str, int]:
        [stats] = extensions[when][protocol]["model_stats"]
        assert stats["name"] == "llm"
        inference = stats["inference_stats"]
        return {"executions": int(stats["execution_count"]), "inferences": int(stats["inference_count"]),
                "success": int(inference["success"].get("count", 0)),
                "hits": int(inference.get("cache_hit", {}).get("count", 0)),
                "misses": int(inference.get("cache_miss", {}).get("count", 0))}  # fmt: skip

    for protocol in ("http", "grpc"):
        before, after = counts("before", protocol), counts("after", protocol)
        # The same prompt twice: two executions of one prompt each (on gRPC, read after HTTP's).
        assert after["executions"] - before["executions"] == 2, (protocol, before, after)
        assert after["inferences"] - before["inferences"] == 2 and after["success"] - before["success"] == 2
        if extensions["server"] == "transformer":  # the first a miss, the second an exact hit
            assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1)
        else:
            assert after["hits"] == after["misses"] == 0
    [stats] = extensions["after"]["http"]["model_stats"]
    assert int(stats["last_inference"]) > 0 and int(stats["inference_stats"]["success"]["ns"]) > 0
    assert "llm" in [m["name"] for m in extensions["all_models"]["model_stats"]]


def test_extension_errors_name_the_model_or_the_version(extensions: dict[str, Any]) -> None:
    assert extensions["http_unknown"].startswith("[404]") and "'nope' not found" in extensions["http_unknown"]
    assert extensions["grpc_unknown"].startswith("[StatusCode.NOT_FOUND]"), extensions["grpc_unknown"]
    assert extensions["grpc_version"].startswith("[StatusCode.INVALID_ARGUMENT]"), extensions["grpc_version"]
    assert "model versioning is not supported" in extensions["grpc_version"]
