"""v2 REST against the real predictor: infer (B=1, B=4), metadata, health, determinism."""

from __future__ import annotations

import httpx

from tests.conftest import FRANCE, Predictor


def infer(p: Predictor, prompts: list[str], **params: object) -> httpx.Response:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [len(prompts)], "data": prompts}],
        "parameters": {"max_tokens": 16, "temperature": 0, **params},
    }
    return httpx.post(f"{p.http}/v2/models/llm/infer", json=body, timeout=120)


def outputs(resp: httpx.Response) -> dict[str, list]:
    return {o["name"]: o["data"] for o in resp.json()["outputs"]}


def test_health_and_readiness(predictor: Predictor) -> None:
    assert httpx.get(f"{predictor.http}/v2/health/live").status_code == 200
    ready = httpx.get(f"{predictor.http}/v2/health/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert httpx.get(f"{predictor.http}/v2/models/llm/ready").status_code == 200


def test_metadata_lists_the_tensor_contract(predictor: Predictor) -> None:
    meta = httpx.get(f"{predictor.http}/v2/models/llm").json()
    assert meta["name"] == "llm"
    inputs = {i["name"]: i for i in meta["inputs"]}
    outs = {o["name"]: o for o in meta["outputs"]}
    assert inputs["text_input"]["datatype"] == "BYTES"
    assert set(outs) == {"text_output", "finish_reason", "completion_tokens", "logprobs", "prompt_logprobs",
                       "prompt_text"}
    assert outs["completion_tokens"]["datatype"] == "INT32"


def test_infer_single_prompt_answers_paris(predictor: Predictor) -> None:
    resp = infer(predictor, [FRANCE])
    assert resp.status_code == 200, resp.text
    out = outputs(resp)
    assert "Paris" in out["text_output"][0]
    assert out["finish_reason"] == ["stop"]
    assert out["completion_tokens"][0] > 0


def test_infer_batch_of_four(predictor: Predictor) -> None:
    prompts = [FRANCE, "Once upon a time", "def fibonacci(n):", "The weather today is"]
    resp = infer(predictor, prompts, max_tokens=8)
    assert resp.status_code == 200, resp.text
    out = outputs(resp)
    assert len(out["text_output"]) == 4
    assert all(isinstance(t, str) and t for t in out["text_output"])
    assert all(r in ("stop", "length") for r in out["finish_reason"])
    assert all(0 < n <= 8 for n in out["completion_tokens"])
    # The batch answers each prompt as it would alone (temperature 0).
    assert out["text_output"][0] == outputs(infer(predictor, [FRANCE], max_tokens=8))["text_output"][0]


def test_temperature_zero_is_deterministic(predictor: Predictor) -> None:
    first = outputs(infer(predictor, ["Tell me a fact about the sea."], max_tokens=24))
    second = outputs(infer(predictor, ["Tell me a fact about the sea."], max_tokens=24))
    assert first["text_output"] == second["text_output"]


def test_length_limit_and_stop_strings(predictor: Predictor) -> None:
    out = outputs(infer(predictor, ["Count: 1, 2, 3,"], max_tokens=3, ignore_eos=True))
    assert out["finish_reason"] == ["length"] and out["completion_tokens"] == [3]
    stopped = outputs(infer(predictor, [FRANCE], max_tokens=16, stop='["Paris"]'))
    assert "Paris" not in stopped["text_output"][0]
    assert stopped["finish_reason"] == ["stop"]


def test_sampling_parameters_input_tensor(predictor: Predictor) -> None:
    body = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [FRANCE]},
            {
                "name": "sampling_parameters",
                "datatype": "BYTES",
                "shape": [1],
                "data": ['{"max_tokens": 2, "temperature": 0, "ignore_eos": true}'],
            },
        ]
    }
    resp = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert outputs(resp)["completion_tokens"] == [2]


def test_seeded_sampling_repeats(predictor: Predictor) -> None:
    a = outputs(infer(predictor, ["Write a word:"], temperature=0.9, seed=7, max_tokens=8))
    b = outputs(infer(predictor, ["Write a word:"], temperature=0.9, seed=7, max_tokens=8))
    assert a["text_output"] == b["text_output"]


def test_request_id_is_echoed(predictor: Predictor) -> None:
    resp = httpx.post(
        f"{predictor.http}/v2/models/llm/infer",
        json={
            "id": "abc-123",
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["Hi"]}],
            "parameters": {"max_tokens": 2},
        },
        headers={"x-request-id": "trace-42"},
        timeout=60,
    )
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "trace-42"
    assert resp.json()["id"] == "abc-123"


def test_metrics_expose_ours_kserves_and_vllms(predictor: Predictor) -> None:
    infer(predictor, ["Hello"], max_tokens=2)
    text = httpx.get(f"{predictor.http}/metrics").text
    for name in (
        "semserve_predictor_time_to_first_token_seconds_bucket",
        "semserve_predictor_inter_token_latency_seconds_bucket",
        "semserve_predictor_prompt_tokens_total",
        "semserve_predictor_completion_tokens_total",
        "semserve_predictor_requests_in_flight",
        "semserve_predictor_requests_aborted_total",
        "request_predict_seconds_bucket",
        "vllm:generation_tokens_total",
    ):
        assert name in text, name
    assert 'protocol="v2-rest"' in text
