"""The v2 tensor contract, parsed without an engine."""

from __future__ import annotations

import pytest
from kserve import InferInput, InferRequest

from semserve import v2
from semserve.errors import BadRequest


def req(inputs: list[InferInput], **params: object) -> InferRequest:
    return InferRequest("llm", inputs, parameters=params or None)


def test_parses_prompts_and_sampling() -> None:
    r = v2.parse_request(
        req([InferInput("text_input", [2], "BYTES", ["a", "b"])], max_tokens=5, temperature=0,
            stop='["x", "y"]', custom="kept"),
        max_batch=8,
    )
    assert r.prompts == ["a", "b"]
    assert r.sampling.max_tokens == 5 and r.sampling.temperature == 0.0
    assert r.sampling.stop == ("x", "y")
    assert r.extra == {"custom": "kept"}


def test_b_by_1_shape_is_accepted() -> None:
    r = v2.parse_request(req([InferInput("text_input", [2, 1], "BYTES", [["a"], ["b"]])]), 8)
    assert r.prompts == ["a", "b"]


@pytest.mark.parametrize(
    ("inputs", "params", "field"),
    [
        ([], {}, "text_input"),
        ([InferInput("text_input", [1], "BYTES", [b"\xff"])], {}, "text_input"),
        ([InferInput("text_input", [1], "BYTES", ["ok"])], {"seed": -1}, "seed"),
        ([InferInput("text_input", [1], "BYTES", ["ok"])], {"top_k": 0}, "top_k"),
        ([InferInput("text_input", [1], "BYTES", ["ok"])], {"temperature": True}, "temperature"),
        ([InferInput("text_input", [1], "BYTES", ["ok"])], {"stop": 5}, "stop"),
    ],
)
def test_errors_name_the_field(inputs: list[InferInput], params: dict, field: str) -> None:
    with pytest.raises(BadRequest) as err:
        v2.parse_request(req(inputs, **params), 8)
    assert err.value.field == field


def test_response_round_trip() -> None:
    results = [v2.TextResult("hi", "stop", 1), v2.TextResult("yo", "length", 4)]
    resp = v2.build_response("llm", "id1", results)
    assert v2.read_response(resp) == results
