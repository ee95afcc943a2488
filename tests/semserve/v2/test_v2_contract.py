"""The v2 tensor contract, parsed without an engine."""

from __future__ import annotations

import json

import pytest
from kserve import InferInput, InferRequest

from semserve import v2
from semserve.answer import Answer, TokenLogprob
from semserve.errors import BadRequest
from semserve.openai_protocol import TokenPrompt


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
    results = [Answer("hi", "stop", 1), Answer("yo", "length", 4)]
    resp = v2.build_response("llm", "id1", results)
    assert v2.read_response(resp) == results


def test_prompt_logprobs_round_trip_in_a_column_of_their_own() -> None:
    # The prompt's first token has no logprob: null in the JSON, None again when read back.
    prompt = (TokenLogprob("The", None), TokenLogprob(" sky", -3.5, ((" sky", -3.5),)))
    results = [Answer(" is", "length", 1, logprobs=(TokenLogprob(" is", -0.25),), prompt_logprobs=prompt),
               Answer("", "length", 1, prompt_logprobs=prompt[:1])]  # fmt: skip
    resp = v2.build_response("llm", "id1", results)
    names = [o.name for o in resp.outputs]
    assert names[-2:] == ["logprobs", "prompt_logprobs"]
    assert json.loads(resp.get_output_by_name("prompt_logprobs").data[1]) == [["The", None, []]]
    second = Answer("", "length", 1, logprobs=(), prompt_logprobs=prompt[:1])  # the column is there: ()
    assert v2.read_response(resp) == [results[0], second]
    # Asked through a parameter, as vLLM names it; never a cache key (semserve.sampling).
    r = v2.parse_request(req([InferInput("text_input", [1], "BYTES", ["a"])], prompt_logprobs=2), 8)
    assert r.sampling.prompt_logprobs == 2


def _chat(**fields: object) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "Hi"}], **fields})


def test_chat_input_parses_into_chat_prompts() -> None:
    r = v2.parse_request(
        req([InferInput("chat", [1], "BYTES", [_chat(chat_template_kwargs={"enable_thinking": False})])],
            temperature=0),
        8,
    )
    assert r.prompts == [] and r.size == 1
    assert r.chats[0].last_text == "Hi" and r.chats[0].chat_template_kwargs == {"enable_thinking": False}


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_a_chat_s_forced_tool_call_is_the_request_s_constraint() -> None:
    # The call's arguments are what the text output holds; the transformer sends the constraint
    # too, which must then be the same one.
    named = _chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = v2.parse_request(req([InferInput("chat", [1], "BYTES", [named])]), 8)
    assert json.loads(r.sampling.structured_outputs) == {"json": TOOL["function"]["parameters"]}
    given = json.dumps({"json": TOOL["function"]["parameters"]})
    assert v2.parse_request(req([InferInput("chat", [1], "BYTES", [named])], structured_outputs=given), 8)
    with pytest.raises(BadRequest, match="tool_choice and structured_outputs ask for different outputs"):
        v2.parse_request(req([InferInput("chat", [1], "BYTES", [named])],
                             structured_outputs='{"regex": "x"}'), 8)  # fmt: skip
    plain = _chat(tools=[TOOL], tool_choice="none")
    with pytest.raises(BadRequest, match="the same response_format and tool_choice"):
        v2.parse_request(req([InferInput("chat", [2], "BYTES", [named, plain])]), 8)


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ([InferInput("chat", [1], "BYTES", ["not json"])], "chat"),
        ([InferInput("chat", [1], "BYTES", [json.dumps({"messages": []})])], "chat"),
        ([InferInput("chat", [1], "BYTES", [_chat(unknown_field=1)])], "chat"),
        ([InferInput("chat", [1], "BYTES", [_chat(tools=[{"type": "function"}])])], "chat"),  # no function
        ([InferInput("chat", [1], "BYTES", [_chat(tools=[TOOL])])], "tool_choice"),  # "auto" needs a parser
        ([InferInput("chat", [1], "BYTES", [_chat(chat_template_kwargs={"tokenize": True})])],
         "chat_template_kwargs"),
        ([InferInput("chat", [1], "BYTES", [_chat()]), InferInput("text_input", [1], "BYTES", ["x"])],
         "chat"),
        ([InferInput("text_input", [1], "BYTES", ["x"]), InferInput("stream", [1], "BYTES", ["yes"])],
         "stream"),
    ],
)
def test_chat_and_stream_errors_name_the_field(inputs: list[InferInput], field: str) -> None:
    with pytest.raises(BadRequest) as err:
        v2.parse_request(req(inputs), 8)
    assert err.value.field == field


def test_stream_comes_from_the_input_or_the_parameter() -> None:
    text = InferInput("text_input", [1], "BYTES", ["x"])
    assert not v2.parse_request(req([text]), 8).stream
    assert v2.parse_request(req([text, InferInput("stream", [1], "BOOL", [True])]), 8).stream
    parsed = v2.parse_request(req([text], stream=True), 8)
    assert parsed.stream and "stream" not in parsed.extra


def test_piece_response_fills_only_its_prompt() -> None:
    resp = v2.piece_response("llm", "r", 3, 1, Answer("lo", "", 2), {"prompt_tokens": 9})
    assert v2.read_response(resp) == [
        Answer("", "", 0), Answer("lo", "", 2), Answer("", "", 0)
    ]


def test_input_ids_are_token_prompts() -> None:
    # [L]: one prompt; [B, L]: B prompts of L tokens; INT32 or INT64.
    one = v2.parse_request(req([InferInput("input_ids", [3], "INT64", [5, 6, 7])]), 8)
    assert one.prompts == [TokenPrompt((5, 6, 7))] and one.size == 1
    two = v2.parse_request(req([InferInput("input_ids", [2, 2], "INT32", [[1, 2], [3, 4]])], max_tokens=3), 8)
    assert two.prompts == [TokenPrompt((1, 2)), TokenPrompt((3, 4))] and two.sampling.max_tokens == 3


@pytest.mark.parametrize(("inputs", "message"), [
    ([InferInput("input_ids", [2], "BYTES", ["1", "2"])], "input_ids must have datatype INT32 or INT64"),
    ([InferInput("input_ids", [1, 0], "INT64", [])], "input_ids must have shape [L] or [B, L] with L >= 1"),
    ([InferInput("input_ids", [2], "INT64", [3, -1])], "input_ids must hold token ids (non-negative)"),
    ([InferInput("input_ids", [9, 1], "INT64", [[1]] * 9)], "input_ids holds 9 prompts; at most 8"),
    ([InferInput("text_input", [1], "BYTES", ["a"]), InferInput("input_ids", [1], "INT64", [1])],
     "send one of 'text_input', 'chat' and 'input_ids', not 'text_input' and 'input_ids'"),
])  # fmt: skip
def test_input_ids_errors_name_the_input(inputs: list[InferInput], message: str) -> None:
    with pytest.raises(BadRequest) as err:
        v2.parse_request(req(inputs), 8)
    assert err.value.field == "input_ids" and message in err.value.message, err.value.message


def test_prompt_text_comes_back_for_token_prompts_only() -> None:
    results = [Answer(" there", "stop", 1, prompt_text="Hi"), Answer(" yo", "stop", 1, prompt_text="Yo")]
    resp = v2.build_response("llm", "id1", results)
    assert v2.read_response(resp) == results
    assert v2.build_response("llm", "id2", [Answer("x", "stop", 1)]).get_output_by_name("prompt_text") is None
