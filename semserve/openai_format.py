"""How answers and the pieces of a generation become OpenAI's objects: one formatter per route
(chat, completions), for whole responses and for streams, the same in both services.

A formatter knows the request's choices (`n` per prompt: choice i answers prompt i // n), what it
asked to have reported (usage, logprobs, echo) and what it has sent so far of each choice.
"""

from __future__ import annotations

from typing import Any

from semserve import openai_protocol as oa
from semserve.answer import Answer, Piece
from semserve.openai_tools import ToolCall, ToolUse


class Formatter:
    """How answers and the pieces of a generation become one OpenAI response or stream."""

    CHAT = False

    def __init__(self, model: str, rid: str, created: int, usage: oa.UsageReport, n: int = 1) -> None:
        self.model, self.rid, self.created = model, rid, created
        self.usage_report = usage
        self.n = n  # choices per prompt: choice i answers prompt i // n
        self.logprobs = oa.LogprobsReport(chat=self.CHAT)

    def whole(self, answers: list[Answer]) -> Any:
        raise NotImplementedError

    def start(self, first: Piece | None, index: int) -> Any:
        """The chunk of choice `index` before its first piece (`first`, when it is known by then),
        if any."""
        return None

    def piece(self, piece: Piece, index: int) -> list[Any]:
        raise NotImplementedError

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        raise NotImplementedError

    def total_usage(self, answers: list[Answer]) -> Any:
        """The closing usage chunk over all choices: each prompt's tokens once, as vLLM counts."""
        return self.usage(sum(a.prompt_tokens for a in answers[:: self.n]),
                          sum(a.completion_tokens for a in answers))  # fmt: skip


class ChatFormatter(Formatter):
    CHAT = True

    def __init__(
        self, model: str, rid: str, created: int, usage: oa.UsageReport, n: int = 1,
        tools: ToolUse | None = None,
    ) -> None:
        super().__init__(model, rid, created, usage, n)
        self.tools = tools  # a forced tool call: the generated text is the call
        self._opened: set[int] = set()  # a named call: the choices whose call has been opened
        self._written: dict[int, str] = {}  # "required": each choice's text, parsed when it ends

    def whole(self, answers: list[Answer]) -> oa.ChatCompletion:
        # One answer per choice (OpenAI's n) of one prompt: its tokens counted once.
        logprobs = [self.logprobs.of(i, a.logprobs) for i, a in enumerate(answers)]
        calls = [self.tools.calls(a.text) if self.tools else [] for a in answers]
        reasons = [self._finish(a.finish_reason, made) for a, made in zip(answers, calls, strict=True)]
        return oa.chat_completion(self.rid, self.model, self.created, [a.text for a in answers], reasons,
                                  answers[0].prompt_tokens, sum(a.completion_tokens for a in answers),
                                  logprobs, calls)  # fmt: skip

    def _finish(self, reason: str | None, calls: list[ToolCall]) -> str | None:
        return self.tools.finish_reason(reason, calls) if self.tools else reason

    def start(self, first: Piece | None, index: int) -> Any:
        # OpenAI sends each choice's role first, in a chunk of its own with empty content.
        so_far = self.usage_report.so_far(first.prompt_tokens, 0) if first is not None else None
        return self._chunk("", None, so_far, index, role=True)

    def piece(self, piece: Piece, index: int) -> list[Any]:
        if self.tools is not None:
            return self._call_piece(piece, index, self.tools)
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        out = []
        # The new tokens' logprobs ride with their text (alone when the text is not whole yet).
        logprobs = self.logprobs.of(index, piece.logprobs)
        if piece.text or logprobs is not None:
            out.append(self._chunk(piece.text, None, so_far, index, logprobs))
        if piece.finish_reason:
            out.append(self._chunk(None, piece.finish_reason, so_far, index))
        return out

    def _call_piece(self, piece: Piece, index: int, tools: ToolUse) -> list[Any]:
        """A named call's arguments stream as they come; "required" calls are a JSON list that is
        parsed once whole, so they come in one chunk when the choice ends."""
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        logprobs = self.logprobs.of(index, piece.logprobs)
        out = []
        deltas = None
        if tools.function is not None and piece.text:
            first = index not in self._opened
            self._opened.add(index)
            deltas = oa.arguments_delta(piece.text, tools.function if first else None)
        if deltas is not None or logprobs is not None:
            out.append(self._chunk(None, None, so_far, index, logprobs, tool_calls=deltas))
        written = self._written[index] = self._written.get(index, "") + piece.text
        if piece.finish_reason:
            calls = tools.calls(written)
            if tools.required:
                # Not a call after all (cut short, say): the text is answered as content.
                deltas = oa.tool_call_deltas(calls) if calls else None
                out.append(self._chunk(None if calls else written, None, so_far, index, tool_calls=deltas))
            out.append(self._chunk(None, tools.finish_reason(piece.finish_reason, calls), so_far, index))
        return out

    def _chunk(
        self, content: str | None, finish_reason: str | None, so_far: Any, index: int, logprobs: Any = None,
        *, role: bool = False, tool_calls: list[Any] | None = None,
    ) -> Any:
        return oa.chat_chunk(self.rid, self.model, self.created, content, finish_reason, role, so_far,
                             self.usage_report.final, index=index, logprobs=logprobs,
                             tool_calls=tool_calls)  # fmt: skip

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.chat_usage_chunk(self.rid, self.model, self.created, prompt_tokens, completion_tokens)


class CompletionFormatter(Formatter):
    def __init__(self, model: str, rid: str, created: int, usage: oa.UsageReport, echo: oa.Echo) -> None:
        super().__init__(model, rid, created, usage, echo.n)
        self.echo = echo

    def whole(self, answers: list[Answer]) -> oa.Completion:
        # Prompt by prompt, its n choices together: each prompt's tokens counted once.
        return oa.completion(
            self.rid, self.model, self.created,
            [self.echo.whole(i, a.text, a.prompt_text) for i, a in enumerate(answers)],
            [a.finish_reason for a in answers],
            sum(a.prompt_tokens for a in answers[:: self.n]),
            sum(a.completion_tokens for a in answers),
            [self.logprobs.of(i, self.echo.logprobs(a.prompt_logprobs, a.logprobs))
             for i, a in enumerate(answers)],
        )  # fmt: skip

    def piece(self, piece: Piece, index: int) -> list[Any]:
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        logprobs = self.echo.piece_logprobs(index, piece.prompt_logprobs, piece.logprobs)
        text = self.echo.piece(index, piece.text, piece.prompt_text)
        return [oa.completion_chunk(self.rid, self.model, self.created, index, text, piece.finish_reason,
                                    so_far, self.logprobs.of(index, logprobs))]  # fmt: skip

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.completion_usage_chunk(self.rid, self.model, self.created, prompt_tokens,
                                         completion_tokens)
