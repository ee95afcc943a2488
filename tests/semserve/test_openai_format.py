"""semserve.openai_format: answers and pieces as OpenAI's objects, whole and streamed, with what the
request asked to have reported (usage, echo, logprobs)."""

from __future__ import annotations

import math

from semserve import openai_protocol as oa
from semserve.answer import Answer, Piece, TokenLogprob
from semserve.openai_format import ChatFormatter, CompletionFormatter


def test_formatters() -> None:
    a = Answer("Paris.", "stop", 2, 7)
    chat = ChatFormatter("llm", "chatcmpl-1", 1, oa.UsageReport(final=True))
    whole = chat.whole([a])
    assert whole.choices[0].message.content == "Paris." and whole.usage.prompt_tokens == 7
    assert chat.start(None, 0) is not None
    pieces = chat.piece(Piece("Paris.", "stop", 2, 7, None), 0)
    assert len(pieces) == 2  # text, then the finish reason
    assert all(p.usage is None for p in pieces)  # null but in the last chunk (OpenAI's include_usage)
    comp = CompletionFormatter("llm", "cmpl-1", 1, oa.UsageReport(), oa.Echo(None, 1))
    both = comp.whole([a, Answer("Rome.", "length", 3, 5)])
    assert [c.text for c in both.choices] == ["Paris.", "Rome."]
    assert both.usage.prompt_tokens == 12 and both.usage.completion_tokens == 5
    assert comp.start(None, 0) is None and len(comp.piece(Piece("x", None, 1, 1, None), 0)) == 1
    # vLLM's echo: each choice's prompt first (choice i answers prompt i // n), once per stream.
    echo = CompletionFormatter("llm", "cmpl-3", 1, oa.UsageReport(), oa.Echo(["Q1 ", "Q2 "], 2))
    assert [c.text for c in echo.whole([a, a, a, a]).choices] == ["Q1 Paris."] * 2 + ["Q2 Paris."] * 2
    [first] = echo.piece(Piece("Pa", None, 1, 1, None), 2)
    [then] = echo.piece(Piece("ris", None, 2, 1, None), 2)
    assert (first.choices[0].index, first.choices[0].text, then.choices[0].text) == (2, "Q2 Pa", "ris")
    # vLLM's continuous usage: every chunk says the usage so far, the role chunk the prompt's.
    continuous = ChatFormatter("llm", "chatcmpl-2", 1, oa.UsageReport(final=True, continuous=True))
    assert continuous.start(Piece("Pa", None, 1, 7, None), 0).usage.prompt_tokens == 7
    [text, finish] = continuous.piece(Piece("ris.", "stop", 2, 7, None), 1)
    assert text.choices[0].index == finish.choices[0].index == 1
    assert (text.usage.completion_tokens, finish.usage.total_tokens) == (2, 9)


def test_logprobs_whole_and_streamed() -> None:
    paris = (TokenLogprob(" Par", -0.5, ((" Par", -0.5), (" Lyon", -1.5))),
             TokenLogprob("is", -0.01, (("is", -0.01),)))  # fmt: skip
    answer = Answer(" Paris", "stop", 2, 5, logprobs=paris)
    chat = ChatFormatter("llm", "chatcmpl-1", 1, oa.UsageReport()).whole([answer]).choices[0].logprobs
    assert [(t.token, t.logprob, t.bytes) for t in chat.content] == [(" Par", -0.5, [32, 80, 97, 114]),
                                                                  ("is", -0.01, [105, 115])]  # fmt: skip
    assert [(a.token, a.logprob) for a in chat.content[0].top_logprobs] == [(" Par", -0.5), (" Lyon", -1.5)]
    comp = CompletionFormatter("llm", "cmpl-1", 1, oa.UsageReport(), oa.Echo(None, 1))
    whole = comp.whole([answer]).choices[0].logprobs
    assert (whole.tokens, whole.token_logprobs, whole.text_offset) == ([" Par", "is"], [-0.5, -0.01], [0, 4])
    assert whole.top_logprobs == [{" Par": -0.5, " Lyon": -1.5}, {"is": -0.01}]
    # Streamed: each chunk its own tokens, text offsets running on over the choice's pieces.
    comp = CompletionFormatter("llm", "cmpl-2", 1, oa.UsageReport(), oa.Echo(None, 1))
    [first] = comp.piece(Piece(" Par", None, 1, 5, logprobs=paris[:1]), 0)
    [second] = comp.piece(Piece("is", "stop", 2, 5, logprobs=paris[1:]), 0)
    assert (first.choices[0].logprobs.text_offset, second.choices[0].logprobs.text_offset) == ([0], [4])
    # A token whose text is not whole yet still reports its logprob, in a chunk of its own.
    partial = (TokenLogprob("", -2.0),)
    chat_stream = ChatFormatter("llm", "chatcmpl-3", 1, oa.UsageReport())
    [chunk] = chat_stream.piece(Piece("", None, 1, 5, logprobs=partial), 0)
    assert chunk.choices[0].delta.content == "" and chunk.choices[0].logprobs.content[0].logprob == -2.0
    # -inf is not JSON: clamped as vLLM clamps it.
    floor = oa.completion_logprobs((TokenLogprob("x", -math.inf, (("x", -math.inf),)),))
    assert floor.token_logprobs == [-9999.0] and floor.top_logprobs == [{"x": -9999.0}]
    # Not asked for: no logprobs field filled.
    assert CompletionFormatter("llm", "c", 1, oa.UsageReport(), oa.Echo(None, 1)).whole(
        [Answer("x", "stop", 1, 1)]).choices[0].logprobs is None


def test_echo_with_logprobs_reports_the_prompts_tokens_first() -> None:
    # vLLM's echo with logprobs: the prompt's tokens, the first with null logprob and top_logprobs
    # (nothing predicts it), then the generated ones; text offsets over the echoed text.
    prompt = (TokenLogprob("The", None), TokenLogprob(" sky", -3.25, ((" sky", -3.25), (" end", -2.0))))
    blue = (TokenLogprob(" is", -0.5, ((" is", -0.5),)),)
    answer = Answer(" is", "length", 1, 2, logprobs=blue, prompt_logprobs=prompt)
    whole = CompletionFormatter("llm", "cmpl-1", 1, oa.UsageReport(), oa.Echo(["The sky"], 1)).whole([answer])
    [choice] = whole.choices
    assert choice.text == "The sky is"
    assert choice.logprobs.tokens == ["The", " sky", " is"]
    assert choice.logprobs.token_logprobs == [None, -3.25, -0.5]
    assert choice.logprobs.top_logprobs == [None, {" sky": -3.25, " end": -2.0}, {" is": -0.5}]
    assert choice.logprobs.text_offset == [0, 3, 7]
    assert whole.usage.prompt_tokens == 2 and whole.usage.completion_tokens == 1
    # max_tokens 0 (echo without generation): the prompt alone, text and logprobs; vLLM still
    # counts the one step it ran.
    only = CompletionFormatter("llm", "cmpl-2", 1, oa.UsageReport(), oa.Echo(["The sky"], 1, generates=False))
    [choice] = only.whole([answer]).choices
    assert (choice.text, choice.logprobs.tokens) == ("The sky", ["The", " sky"])
    # Streamed: the prompt's tokens ride with the choice's first piece, then each piece its own.
    stream = CompletionFormatter("llm", "cmpl-3", 1, oa.UsageReport(), oa.Echo(["The sky"], 1))
    [first] = stream.piece(Piece(" is", None, 1, 2, logprobs=blue, prompt_logprobs=prompt), 0)
    [then] = stream.piece(Piece(" blue", "length", 2, 2, logprobs=(TokenLogprob(" blue", -1.0),)), 0)
    assert first.choices[0].text == "The sky is" and then.choices[0].text == " blue"
    assert first.choices[0].logprobs.token_logprobs == [None, -3.25, -0.5]
    assert (first.choices[0].logprobs.text_offset, then.choices[0].logprobs.text_offset) == ([0, 3, 7], [10])
    streamed_only = CompletionFormatter("llm", "cmpl-4", 1, oa.UsageReport(), oa.Echo(["The sky"], 1, False))
    [first] = streamed_only.piece(Piece(" is", None, 1, 2, logprobs=blue, prompt_logprobs=prompt), 0)
    [last] = streamed_only.piece(Piece(" blue", "length", 2, 2, logprobs=blue), 0)
    assert (first.choices[0].text, first.choices[0].logprobs.tokens) == ("The sky", ["The", " sky"])
    assert (last.choices[0].text, last.choices[0].logprobs) == ("", None)
    assert last.choices[0].finish_reason == "length"
