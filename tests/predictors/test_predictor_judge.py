"""The predictor's same-answer judge model, `{model}-judge` (predictors/judge.py): its arithmetic and
input checks alone, then against the real predictor over v2 REST, gRPC (tritonclient, and the
transformer's own PredictorClient) beside the main model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import httpx
import pytest
from kserve import InferInput, InferRequest

from predictors.judge import AnswerTokens, judge_messages, parse_request, same_answer_probability
from semserve import model_prep
from semserve.errors import BadRequest
from semserve.judge_protocol import (
    CACHED_INPUT,
    PROBABILITY_OUTPUT,
    QUERY_INPUT,
    judge_model_name,
)
from tests.conftest import FRANCE, Predictor
from transformers_svc.config import TransformerSettings
from transformers_svc.predictor_client import PredictorClient

MODEL = "llm"
JUDGE = judge_model_name(MODEL)
QUERY = "What is the capital of France?"
CACHED = "Which city is the capital of France?"

# tritonclient's protobuf package cannot share a process with KServe's (tests/clients/triton_check.py).
TRITON = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient

address, model, query, cached = sys.argv[1:5]
client = grpcclient.InferenceServerClient(address)
inputs = []
for name, text in (("query", query), ("cached", cached)):
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    inputs.append(tensor)
result = client.infer(model, inputs, request_id="triton-judge")
value = result.as_numpy("same_answer_probability")
print(json.dumps({"ready": client.is_model_ready(model), "values": value.tolist(),
                  "dtype": str(value.dtype), "id": result.get_response().id}))
"""


# -- without a predictor ------------------------------------------------------------------------


def test_probability_is_yes_over_yes_and_no() -> None:
    tokens = AnswerTokens(yes=frozenset({1, 2}), no=frozenset({3}))
    top = {1: math.log(0.3), 2: math.log(0.1), 3: math.log(0.2), 9: math.log(0.4)}
    assert same_answer_probability(top, tokens) == pytest.approx(0.4 / 0.6)
    assert same_answer_probability({3: math.log(0.5)}, tokens) == 0.0
    assert same_answer_probability({1: math.log(0.5)}, tokens) == 1.0


def test_neither_answer_among_the_top_tokens_rejects() -> None:
    tokens = AnswerTokens(yes=frozenset({1}), no=frozenset({2}))
    assert same_answer_probability({9: 0.0}, tokens) == 0.0
    assert same_answer_probability({}, tokens) == 0.0


def test_answer_tokens_of_the_shipped_tokenizer_are_single_tokens() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_prep.prepare().model_dir))
    tokens = AnswerTokens.of(tokenizer)
    assert len(tokens.yes) == 4 and len(tokens.no) == 4  # SmolLM2: every spelling is one token
    assert not tokens.yes & tokens.no
    assert {tokenizer.decode([t]).strip() for t in tokens.yes} == {"Yes", "yes"}
    rendered = tokenizer.apply_chat_template(
        judge_messages(QUERY, CACHED), tokenize=False, add_generation_prompt=True
    )
    assert f"Question 1: {QUERY}\nQuestion 2: {CACHED}\n" in rendered


def judge_request(**inputs: tuple[str, list[int], list[Any]]) -> InferRequest:
    return InferRequest(
        model_name=JUDGE,
        infer_inputs=[InferInput(n, shape, dt, data) for n, (dt, shape, data) in inputs.items()],
    )


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({CACHED_INPUT: ("BYTES", [1], [CACHED])}, QUERY_INPUT),
        ({QUERY_INPUT: ("BYTES", [1], [QUERY])}, CACHED_INPUT),
        ({QUERY_INPUT: ("BYTES", [1], ["  "]), CACHED_INPUT: ("BYTES", [1], [CACHED])}, QUERY_INPUT),
        ({QUERY_INPUT: ("INT32", [1], [7]), CACHED_INPUT: ("BYTES", [1], [CACHED])}, QUERY_INPUT),
        ({QUERY_INPUT: ("BYTES", [1], [QUERY]), CACHED_INPUT: ("BYTES", [2], [CACHED, QUERY])}, CACHED_INPUT),
        ({QUERY_INPUT: ("BYTES", [1], [QUERY]), CACHED_INPUT: ("BYTES", [1], [CACHED]),
          "text_input": ("BYTES", [1], [QUERY])}, "text_input"),
    ],
    ids=["no-query", "no-cached", "blank-query", "int-query", "two-cached", "unknown-input"],
)
def test_parse_request_names_the_bad_input(inputs: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_request(judge_request(**inputs))
    assert caught.value.field == field and field in caught.value.message


def test_parse_request_reads_both_texts() -> None:
    parsed = parse_request(judge_request(query=("BYTES", [1], [QUERY]), cached=("BYTES", [1], [CACHED])))
    assert (parsed.query, parsed.cached) == (QUERY, CACHED)


async def test_judge_is_unready_and_503_while_the_engine_starts() -> None:
    from predictors.config import PredictorSettings
    from predictors.engine import Engine
    from predictors.judge import SameAnswerJudge
    from semserve.errors import Unavailable as Unavailable503

    judge = SameAnswerJudge(MODEL, Engine(PredictorSettings(), model_prep.prepare().model_dir))
    assert judge.name == JUDGE and judge.load()
    assert await judge.healthy() is False  # registered, but KServe's model ready says 503
    request = judge_request(query=("BYTES", [1], [QUERY]), cached=("BYTES", [1], [CACHED]))
    with pytest.raises(Unavailable503):
        await judge.predict(request, {})


# -- against the real predictor -----------------------------------------------------------------


def rest_judge(p: Predictor, query: Any, cached: Any, **body: Any) -> httpx.Response:
    inputs = [
        {"name": QUERY_INPUT, "datatype": "BYTES", "shape": [1], "data": [query]},
        {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [cached]},
    ]
    return httpx.post(f"{p.http}/v2/models/{JUDGE}/infer", json={"inputs": inputs, **body}, timeout=120)


def probability(resp: httpx.Response) -> float:
    assert resp.status_code == 200, resp.text
    [output] = resp.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (PROBABILITY_OUTPUT, "FP32", [1])
    return float(output["data"][0])


def test_judge_model_is_ready_and_describes_its_tensors(predictor: Predictor) -> None:
    ready = httpx.get(f"{predictor.http}/v2/models/{JUDGE}/ready", timeout=10)
    assert ready.status_code == 200 and ready.json()["ready"] is True
    meta = httpx.get(f"{predictor.http}/v2/models/{JUDGE}", timeout=10).json()
    assert meta["name"] == JUDGE
    assert {i["name"]: i["datatype"] for i in meta["inputs"]} == {QUERY_INPUT: "BYTES", CACHED_INPUT: "BYTES"}
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [(PROBABILITY_OUTPUT, "FP32")]
    # The server and the main model are ready as before.
    assert httpx.get(f"{predictor.http}/v2/health/ready", timeout=10).status_code == 200
    assert httpx.get(f"{predictor.http}/v2/models/{MODEL}/ready", timeout=10).status_code == 200


def test_rest_judge_answers_a_repeatable_probability(predictor: Predictor) -> None:
    first = rest_judge(predictor, QUERY, CACHED, id="judge-rest-1")
    value = probability(first)
    assert 0.0 <= value <= 1.0
    assert first.json()["id"] == "judge-rest-1" and first.json()["model_name"] == JUDGE
    # temperature 0, one token: the same pair, the same probability (batch numerics aside).
    assert probability(rest_judge(predictor, QUERY, CACHED)) == pytest.approx(value, abs=1e-3)
    other = probability(rest_judge(predictor, QUERY, "How do I bake sourdough bread?"))
    assert 0.0 <= other <= 1.0


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ([{"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [CACHED]}], QUERY_INPUT),
        ([{"name": QUERY_INPUT, "datatype": "BYTES", "shape": [1], "data": [QUERY]},
          {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [""]}], CACHED_INPUT),
        ([{"name": QUERY_INPUT, "datatype": "INT32", "shape": [1], "data": [3]},
          {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [CACHED]}], QUERY_INPUT),
        ([{"name": QUERY_INPUT, "datatype": "BYTES", "shape": [2], "data": [QUERY, CACHED]},
          {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [CACHED]}], QUERY_INPUT),
    ],
    ids=["missing-query", "empty-cached", "int-query", "two-queries"],
)
def test_rest_bad_inputs_are_400_naming_the_input(
    predictor: Predictor, inputs: list[dict[str, Any]], field: str
) -> None:
    resp = httpx.post(f"{predictor.http}/v2/models/{JUDGE}/infer", json={"inputs": inputs}, timeout=60)
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["error"]


def test_prompt_past_the_context_is_400_naming_the_longer_input(predictor: Predictor) -> None:
    resp = rest_judge(predictor, QUERY, "capital city " * 12000)
    assert resp.status_code == 400, resp.text
    assert CACHED_INPUT in resp.json()["error"] and "context" in resp.json()["error"]


def test_tritonclient_grpc_reads_the_same_probability(predictor: Predictor) -> None:
    done = subprocess.run(
        [sys.executable, "-c", TRITON, predictor.grpc, JUDGE, QUERY, CACHED],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["ready"] is True and got["dtype"] == "float32" and got["id"] == "triton-judge"
    [value] = got["values"]
    assert value == pytest.approx(probability(rest_judge(predictor, QUERY, CACHED)), abs=1e-3)


async def test_predictor_client_judge_matches_rest(predictor: Predictor) -> None:
    client = PredictorClient(TransformerSettings(predictor_host=predictor.grpc, model_name=MODEL))
    try:
        value = await client.judge(QUERY, CACHED, "client-judge")
        assert 0.0 <= value <= 1.0
        assert value == pytest.approx(probability(rest_judge(predictor, QUERY, CACHED)), abs=1e-3)
        with pytest.raises(BadRequest) as caught:  # the predictor's 400 passes through, field named
            await client.judge(QUERY, " ", "client-judge-bad")
        assert caught.value.field == CACHED_INPUT
    finally:
        await client.close()


def test_main_model_still_answers(predictor: Predictor) -> None:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [FRANCE]}],
        "parameters": {"max_tokens": 12, "temperature": 0},
    }
    resp = httpx.post(f"{predictor.http}/v2/models/{MODEL}/infer", json=body, timeout=120)
    assert resp.status_code == 200
    assert "Paris" in {o["name"]: o["data"] for o in resp.json()["outputs"]}["text_output"][0]
