"""semserve/openai_wire.py's response models write exactly what the `openai` package's own types
write for every builder of semserve/openai_protocol.py (same keys, same order, same values), and the
openai client parses them back into its types with the same content."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types import Model as OpenAIModelCard
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import (
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.completion_choice import Logprobs as CompletionLogprobs
from pydantic import BaseModel

from semserve import openai_protocol as oa
from semserve import openai_wire
from semserve.answer import TokenLogprob
from semserve.openai_tools import ToolCall

THEIRS: dict[str, type[BaseModel]] = {
    "Completion": Completion,
    "CompletionChoice": CompletionChoice,
    "CompletionUsage": CompletionUsage,
    "OpenAIModelCard": OpenAIModelCard,
    "ChatCompletion": ChatCompletion,
    "ChatCompletionChunk": ChatCompletionChunk,
    "ChatCompletionMessage": ChatCompletionMessage,
    "ChatChoice": ChatChoice,
    "ChunkChoice": ChunkChoice,
    "ChoiceDelta": ChoiceDelta,
    "CompletionLogprobs": CompletionLogprobs,
    "ChoiceLogprobs": ChoiceLogprobs,
    "ChatCompletionTokenLogprob": ChatCompletionTokenLogprob,
    "TopLogprob": TopLogprob,
    "ChatCompletionMessageFunctionToolCall": ChatCompletionMessageFunctionToolCall,
    "Function": Function,
    "ChoiceDeltaToolCall": ChoiceDeltaToolCall,
    "ChoiceDeltaToolCallFunction": ChoiceDeltaToolCallFunction,
}
# Two tokens, the first with two alternatives, the second's text not whole yet.
TOKENS = (TokenLogprob(" Pa", -0.25, ((" Pa", -0.25), (" Lyon", -2.0))),
          TokenLogprob("", -1.0, (("", -1.0),)))  # fmt: skip

BUILDERS: list[tuple[str, Callable[[], BaseModel]]] = [
    ("completion", lambda: oa.completion("cmpl-1", "llm", 17, ["a", "b"], ["stop", "length"], 3, 4)),
    ("completion abort", lambda: oa.completion("cmpl-1", "llm", 17, ["a"], ["abort"], 3, 4)),
    ("completion_chunk", lambda: oa.completion_chunk("cmpl-1", "llm", 17, 0, "piece", None)),
    ("completion_chunk last", lambda: oa.completion_chunk("cmpl-1", "llm", 17, 1, "", "length")),
    ("completion_usage_chunk", lambda: oa.completion_usage_chunk("cmpl-1", "llm", 17, 3, 4)),
    ("chat_completion", lambda: oa.chat_completion("chat-1", "llm", 17, ["Paris"], ["stop"], 5, 1)),
    ("chat_completion n=2",
     lambda: oa.chat_completion("chat-1", "llm", 17, ["Paris", "Rome"], ["stop", "length"], 5, 3)),
    ("chat_chunk role", lambda: oa.chat_chunk("chat-1", "llm", 17, "", role=True)),
    ("chat_chunk piece", lambda: oa.chat_chunk("chat-1", "llm", 17, "Par")),
    ("chat_chunk last", lambda: oa.chat_chunk("chat-1", "llm", 17, None, "length")),
    ("chat_usage_chunk", lambda: oa.chat_usage_chunk("chat-1", "llm", 17, 5, 1)),
    ("completion logprobs", lambda: oa.completion("cmpl-1", "llm", 17, [" Pa"], ["length"], 3, 2,
                                                  [oa.completion_logprobs(TOKENS)])),
    ("completion_chunk logprobs", lambda: oa.completion_chunk("cmpl-1", "llm", 17, 0, " Pa", None, None,
                                                              oa.completion_logprobs(TOKENS, 4))),
    ("chat_completion logprobs", lambda: oa.chat_completion("chat-1", "llm", 17, [" Pa"], ["length"], 5, 2,
                                                            [oa.chat_logprobs(TOKENS)])),
    ("chat_chunk logprobs",
     lambda: oa.chat_chunk("chat-1", "llm", 17, " Pa", logprobs=oa.chat_logprobs(TOKENS))),
    ("model_card", lambda: oa.model_card("llm", 17)),
    ("chat_completion tool calls",
     lambda: oa.chat_completion("chat-1", "llm", 17, ["[...]", "x"], ["tool_calls", "length"], 5, 9,
                                calls=[[ToolCall("f", '{"a": 1}'), ToolCall("g", "{}")], []])),
    ("chat_chunk tool calls", lambda: oa.chat_chunk("chat-1", "llm", 17, None, tool_calls=oa.tool_call_deltas(
        [ToolCall("f", '{"a": 1}'), ToolCall("g", "{}")]))),
    ("chat_chunk call opened", lambda: oa.chat_chunk("chat-1", "llm", 17, None,
                                                     tool_calls=oa.arguments_delta('{"a"', "f"))),
    ("chat_chunk arguments",
     lambda: oa.chat_chunk("chat-1", "llm", 17, None, tool_calls=oa.arguments_delta(": 1}"))),
]


def _theirs(obj: BaseModel) -> BaseModel:
    """The same object built from the `openai` package's types, field by field as it was set."""
    cls = THEIRS[type(obj).__name__]
    values: dict[str, Any] = {}
    for name in obj.model_fields_set:
        value = getattr(obj, name)
        if isinstance(value, BaseModel):
            value = _theirs(value)
        elif isinstance(value, list):
            value = [_theirs(v) if isinstance(v, BaseModel) else v for v in value]
        values[name] = value
    # model_construct: the streamed completion chunk carries finish_reason null, which only
    # construction without validation allows (as in oa.completion_chunk).
    return cls.model_construct(**values)


def test_every_wire_model_has_openais_fields_in_openais_order() -> None:
    for name, theirs in THEIRS.items():
        ours = getattr(openai_wire, name)
        assert list(ours.model_fields) == list(theirs.model_fields), name
        for field, info in theirs.model_fields.items():
            assert ours.model_fields[field].is_required() == info.is_required(), (name, field)


@pytest.mark.parametrize("builder", [b for _, b in BUILDERS], ids=[n for n, _ in BUILDERS])
def test_builders_write_what_openais_types_write(builder: Callable[[], BaseModel]) -> None:
    ours = builder()
    assert type(ours).__module__ == "semserve.openai_wire"
    theirs = _theirs(ours)
    # What the routes send: exclude_unset for answers and chunks, everything for model cards.
    assert ours.model_dump_json(exclude_unset=True) == theirs.model_dump_json(exclude_unset=True)
    assert ours.model_dump() == theirs.model_dump()
    # And the openai client's types read it back with the same content (a streamed completion
    # chunk's null finish_reason passes only the client's unvalidated stream parsing).
    streamed_piece = isinstance(ours, openai_wire.Completion) and any(
        c.finish_reason is None for c in ours.choices
    )
    if not streamed_piece:
        parsed = type(theirs).model_validate_json(ours.model_dump_json(exclude_unset=True))
        assert parsed.model_dump() == ours.model_dump()


def test_protocol_imports_no_openai_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, semserve.openai_protocol\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openai'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
