"""The predictor's engine turns validated sampling options into vLLM's SamplingParams; a check that
only vLLM makes (one a later vLLM adds) is still the client's error: a 400 naming vLLM's parameter,
never a 500. semserve.sampling checks first, so the options here are built past it."""

from __future__ import annotations

import pytest

from predictors.engine import Engine
from semserve.errors import BadRequest
from semserve.sampling import SamplingOptions


def engine() -> Engine:
    return object.__new__(Engine)  # no model: building SamplingParams needs none


def test_every_option_reaches_vllm() -> None:
    options = SamplingOptions(max_tokens=9, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop=("x",),
                              ignore_eos=True, presence_penalty=0.1, frequency_penalty=0.2,
                              repetition_penalty=1.1, min_p=0.05, min_tokens=2, stop_token_ids=(7,),
                              include_stop_str_in_output=True, skip_special_tokens=False, logprobs=2,
                              logit_bias=((5, 1.5),), structured_outputs='{"regex":"a+"}',
                              stream_interval=4)  # fmt: skip
    params = engine()._params(options)
    # Two take vLLM's own types: a {token id: bias} dict, and StructuredOutputsParams.
    as_vllm = {"logit_bias": {5: 1.5}}
    for name, value in options.to_dict().items():
        if name == "structured_outputs":
            assert params.structured_outputs.regex == "a+"
        else:
            assert getattr(params, name) == as_vllm.get(name, value), name


def test_a_check_only_vllm_makes_is_a_400_naming_its_parameter() -> None:
    with pytest.raises(BadRequest) as caught:
        engine()._params(SamplingOptions(temperature=5.0))
    assert caught.value.field == "temperature"
    assert "temperature must be in [0, 2]" in str(caught.value)
