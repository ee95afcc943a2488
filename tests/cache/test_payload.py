"""cache/payload.py: the typed answer (semserve/answer.py) and the JSON it is stored as (the
format entries always had)."""

from __future__ import annotations

import json

import pytest

from cache.keys import CacheRequest, SamplingKey, fingerprint
from cache.payload import dumps, loads
from semserve.answer import Answer
from semserve.sampling import SamplingOptions


def test_stored_json_is_the_format_entries_always_had() -> None:
    a = Answer("Paris.", "stop", 2, 7)
    assert json.loads(dumps(a)) == {"text": "Paris.", "finish_reason": "stop", "completion_tokens": 2,
                                    "prompt_tokens": 7}
    labelled = a.with_revision("v2")
    assert json.loads(dumps(labelled))["model_revision"] == "v2"
    assert a.with_revision(None) is a and a.model_revision is None
    assert loads(dumps(labelled)) == labelled and loads(dumps(a)) == a


def test_entries_written_before_the_type_read_as_answers() -> None:
    old = '{"text": "x", "finish_reason": "length", "completion_tokens": "3"}'
    assert loads(old) == Answer("x", "length", 3, 0)
    assert loads(old).complete  # type: ignore[union-attr]
    assert not Answer("x", "", 1).complete


@pytest.mark.parametrize("payload", [{"text": "Paris"}, {"pair": 3}, {"a": 1}, {}])
def test_other_payloads_round_trip_as_they_were(payload: dict) -> None:
    assert loads(dumps(payload)) == payload


def test_sampling_from_options_keys_like_the_mapping_it_replaces() -> None:
    adjusted = SamplingOptions(temperature=0, repetition_penalty=1.3, min_tokens=2, stop_token_ids=(7,),
                               logit_bias=((2, 5.0),), structured_outputs='{"regex":"a+"}')  # fmt: skip
    for options in (SamplingOptions(), SamplingOptions(max_tokens=3, temperature=0, stop=("b", "a"), seed=1),
                    adjusted):  # fmt: skip
        typed = SamplingKey.from_options(options)
        mapped = SamplingKey.from_mapping(options.to_dict())
        assert typed == mapped
        assert fingerprint(CacheRequest("t", "m", "completion", "p", sampling=typed)) == fingerprint(
            CacheRequest("t", "m", "completion", "p", sampling=mapped)
        )
