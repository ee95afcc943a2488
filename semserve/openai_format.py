"""How answers and the pieces of a generation become OpenAI's objects: one formatter per route
(chat, completions), for whole responses and for streams, the same in both services.

A formatter knows the request's choices (`n` per prompt: choice i answers prompt i // n), what it
asked to have reported (usage, logprobs, echo) and what it has sent so far of each choice.
"""

from __future__ import annotations

from typing import Any

from semserve import openai_protocol as oa
from semserve.answer import Answer, Piece


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

    def whole(self, answers: list[Answer]) -> oa.ChatCompletion:
        # One answer per choice (OpenAI's n) of one prompt: its tokens counted once.
        logprobs = [self.logprobs.of(i, a.logprobs) for i, a in enumerate(answers)]
        return oa.chat_completion(self.rid, self.model, self.created, [a.text for a in answers],
                                  [a.finish_reason for a in answers], answers[0].prompt_tokens,
                                  sum(a.completion_tokens for a in answers), logprobs)  # fmt: skip

    def start(self, first: Piece | None, index: int) -> Any:
        # OpenAI sends each choice's role first, in a chunk of its own with empty content.
        so_far = self.usage_report.so_far(first.prompt_tokens, 0) if first is not None else None
        return self._chunk("", None, so_far, index, role=True)

    def piece(self, piece: Piece, index: int) -> list[Any]:
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        out = []
        # The new tokens' logprobs ride with their text (alone when the text is not whole yet).
        logprobs = self.logprobs.of(index, piece.logprobs)
        if piece.text or logprobs is not None:
            out.append(self._chunk(piece.text, None, so_far, index, logprobs))
        if piece.finish_reason:
            out.append(self._chunk(None, piece.finish_reason, so_far, index))
        return out

    def _chunk(
        self, content: str | None, finish_reason: str | None, so_far: Any, index: int, logprobs: Any = None,
        *, role: bool = False,
    ) -> Any:
        return oa.chat_chunk(self.rid, self.model, self.created, content, finish_reason, role, so_far,
                             self.usage_report.final, index=index, logprobs=logprobs)  # fmt: skip

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
            [self.echo.whole(i, a.text) for i, a in enumerate(answers)],
            [a.finish_reason for a in answers],
            sum(a.prompt_tokens for a in answers[:: self.n]),
            sum(a.completion_tokens for a in answers),
            [self.logprobs.of(i, a.logprobs) for i, a in enumerate(answers)],
        )

    def piece(self, piece: Piece, index: int) -> list[Any]:
        so_far = self.usage_report.so_far(piece.prompt_tokens, piece.completion_tokens)
        text = self.echo.piece(index, piece.text)
        return [oa.completion_chunk(self.rid, self.model, self.created, index, text, piece.finish_reason,
                                    so_far, self.logprobs.of(index, piece.logprobs))]  # fmt: skip

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Any:
        return oa.completion_usage_chunk(self.rid, self.model, self.created, prompt_tokens,
                                         completion_tokens)
