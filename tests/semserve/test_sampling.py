"""semserve.sampling: the sampling options every protocol maps onto. vLLM's penalties, min_p and
min_tokens are parsed with vLLM's ranges, a 400 naming the field outside them, and only those set
away from their defaults count as adjustments (what a cache key adds for them)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from semserve.errors import BadRequest
from semserve.sampling import ADJUSTMENT_DEFAULTS, SamplingOptions, parse_sampling


def test_defaults_are_vllm_s_and_adjust_nothing() -> None:
    options = parse_sampling({})
    assert {k: getattr(options, k) for k in ADJUSTMENT_DEFAULTS} == ADJUSTMENT_DEFAULTS
    assert options.adjustments() == {}
    assert parse_sampling(dict(ADJUSTMENT_DEFAULTS)).adjustments() == {}


@pytest.mark.parametrize(
    ("params", "adjusted"),
    [
        ({"presence_penalty": 0.5}, {"presence_penalty": 0.5}),
        ({"frequency_penalty": "-1.5"}, {"frequency_penalty": -1.5}),  # v2 string parameters
        ({"repetition_penalty": 2}, {"repetition_penalty": 2.0}),
        ({"repetition_penalty": 1}, {}),  # its default, as an int
        ({"repetition_penalty": 1.3, "min_p": 0.1}, {"repetition_penalty": 1.3, "min_p": 0.1}),
        ({"min_tokens": 4, "max_tokens": 4}, {"min_tokens": 4}),
        ({"min_tokens": 4.0}, {"min_tokens": 4}),
        ({"presence_penalty": None}, {}),
        ({"stop_token_ids": [2, 7]}, {"stop_token_ids": [2, 7]}),  # JSON-able in a key
        ({"stop_token_ids": []}, {}),
        ({"include_stop_str_in_output": True}, {"include_stop_str_in_output": True}),
        ({"skip_special_tokens": "false"}, {"skip_special_tokens": False}),  # v2 string parameters
        ({"skip_special_tokens": True}, {}),
        # OpenAI's map (ids as JSON strings), by id; JSON-able pairs in a key.
        ({"logit_bias": {"9": -100, "2": 5.5}}, {"logit_bias": [[2, 5.5], [9, -100.0]]}),
        ({"logit_bias": '{"2": 1}'}, {"logit_bias": [[2, 1.0]]}),  # v2's JSON in a string
        ({"logit_bias": {}}, {}),
    ],
)
def test_adjustments_parsed(params: dict[str, Any], adjusted: dict[str, Any]) -> None:
    options = parse_sampling(params)
    assert options.adjustments() == adjusted
    assert {k: v for k, v in options.to_dict().items() if k in adjusted} == adjusted


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2], got 2.5"),
        ({"temperature": -0.1}, "temperature", "temperature must be in [0, 2]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty must be in [-2, 2], got 2.5"),
        ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be > 0, got 0.0"),
        ({"repetition_penalty": "x"}, "repetition_penalty", "repetition_penalty must be a number, got 'x'"),
        ({"min_p": 1.01}, "min_p", "min_p must be in [0, 1]"),
        ({"min_p": True}, "min_p", "min_p must be a number, got bool"),
        ({"min_tokens": -1}, "min_tokens", "min_tokens must be in [0, max_tokens (128)], got -1"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", "min_tokens must be in [0, max_tokens (8)]"),
        ({"min_tokens": 1.5}, "min_tokens", "min_tokens must be an integer"),
        ({"stop_token_ids": 2}, "stop_token_ids", "stop_token_ids must be a list of integers"),
        ({"stop_token_ids": [2, "x"]}, "stop_token_ids", "stop_token_ids must be a list of integers"),
        ({"stop_token_ids": [True]}, "stop_token_ids", "stop_token_ids must be a list of integers"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "stop_token_ids must not be negative"),
        ({"stop_token_ids": [1] * 257}, "stop_token_ids", "stop_token_ids may hold at most 256 ids"),
        ({"skip_special_tokens": 1}, "skip_special_tokens", "skip_special_tokens must be a boolean"),
        ({"logit_bias": {"2": 101}}, "logit_bias", "logit_bias[2] must be in [-100, 100], got 101.0"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "logit_bias keys must be token ids (non-negative integers)"),
        ({"logit_bias": {"-1": 1}}, "logit_bias", "keys must be token ids"),
        ({"logit_bias": {"2": "big"}}, "logit_bias", "logit_bias[2] must be a number"),
        ({"logit_bias": [1, 2]}, "logit_bias", "logit_bias must map token ids to biases"),
        ({"stream_interval": 0}, "stream_interval", "stream_interval must be in [1, 2147483647], got 0"),
        ({"stream_interval": -4}, "stream_interval", "stream_interval must be in [1, 2147483647]"),
        ({"stream_interval": 2**31}, "stream_interval", "stream_interval must be in [1, 2147483647]"),
        ({"stream_interval": 2.5}, "stream_interval", "stream_interval must be an integer"),
        ({"stream_interval": True}, "stream_interval", "stream_interval must be a number, got bool"),
        ({"stream_interval": "often"}, "stream_interval", "stream_interval must be a number, got 'often'"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "prompt_logprobs must be in [0, 20], got 21"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "prompt_logprobs must be in [0, 20], got -1"),
        ({"prompt_logprobs": "all"}, "prompt_logprobs", "prompt_logprobs must be a number, got 'all'"),
    ],
)
def test_out_of_range_is_a_400_naming_the_field(params: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_sampling(params)
    assert caught.value.field == field
    assert message in str(caught.value)


def test_to_dict_round_trips() -> None:
    options = SamplingOptions(max_tokens=9, temperature=0.0, stop=("a",), presence_penalty=0.2, min_tokens=3)
    assert parse_sampling(options.to_dict()) == options


def test_each_choice_of_a_seeded_request_gets_its_own_seed() -> None:
    seeded = SamplingOptions(temperature=1.0, seed=7)
    assert [seeded.for_choice(i).seed for i in range(3)] == [7, 8, 9]  # as vLLM seeds n's children
    assert SamplingOptions(seed=2**63 - 1).for_choice(1).seed == 0  # stays a valid seed
    unseeded = SamplingOptions(temperature=1.0)
    assert unseeded.for_choice(2) is unseeded


def test_structured_outputs_are_one_canonical_constraint() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    one = parse_sampling({"structured_outputs": {"json": schema}}).structured_outputs
    # The same constraint keys alike however it was written: key order, a schema in a string, v2's JSON.
    two = parse_sampling({"structured_outputs": json.dumps({"json": json.dumps(schema)})}).structured_outputs
    assert one == two and json.loads(one) == {"json": schema}
    keyed = parse_sampling({"structured_outputs": {"json": schema}}).adjustments()
    assert keyed == {"structured_outputs": one}
    options = {"choice": ["yes", "no"], "disable_any_whitespace": True}
    assert json.loads(parse_sampling({"structured_outputs": options}).structured_outputs) == options


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "must set exactly one of json, regex, choice, grammar, json_object"),
        ({"regex": "a+", "choice": ["a"]}, "must set exactly one"),
        ({"regexp": "a+"}, "does not take regexp"),
        ({"choice": []}, "structured_outputs.choice is not a valid choice constraint"),
        ({"choice": ["a", 1]}, "not a valid choice constraint"),
        ({"json": "{not json"}, "structured_outputs.json is not a valid JSON schema"),
        ({"json_object": "yes"}, "not a valid json_object constraint"),
        ("{", "structured_outputs is not valid JSON"),
        (["regex"], "must be an object"),
    ],
)
def test_structured_outputs_refused(raw: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as caught:
        parse_sampling({"structured_outputs": raw})
    assert caught.value.field == "structured_outputs"


@pytest.mark.parametrize(("raw", "parsed"), [(None, None), (4, 4), ("8", 8), (1, 1), (2**31 - 1, 2**31 - 1)])
def test_stream_interval_parsed_and_adjusts_nothing(raw: Any, parsed: int | None) -> None:
    # How the answer is delivered, not what it is: no adjustment, so no cache key of its own.
    options = parse_sampling({"stream_interval": raw})
    assert options.stream_interval == parsed
    assert options.adjustments() == {}


def test_prompt_logprobs_are_reported_not_keyed() -> None:
    # What is reported beside the answer, like logprobs: no adjustment, and such an answer is
    # never cached (reports_logprobs is what the transformer bypasses on).
    options = parse_sampling({"prompt_logprobs": "3"})
    assert options.prompt_logprobs == 3 and options.adjustments() == {}
    assert options.reports_logprobs and parse_sampling({"logprobs": 0}).reports_logprobs
    assert not SamplingOptions().reports_logprobs
