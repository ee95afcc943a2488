"""The one result type of both services: an Answer (a whole generation's text result plus the model
revision that made it) and the Pieces it arrives in when streamed. The predictor's engine makes them,
the predictor client reads them off the wire, the transformer caches, replays and formats them.

Answer's JSON ({"text", "finish_reason", "completion_tokens", "prompt_tokens"} plus "model_revision"
when the predictor reported one) is the format cache entries have always had (cache/payload.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

COMPLETE = ("stop", "length")  # finish reasons of a whole answer (not cut off, not failed)


@dataclass(frozen=True)
class TokenLogprob:
    """One token as vLLM's `logprobs` reports it: its text, its logprob, and the most likely tokens
    at its place (most likely first) with theirs. A prompt's first token has no logprob (None) and
    no alternatives: nothing comes before it to predict it."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()

    def to_json(self) -> list[Any]:
        return [self.token, self.logprob, [list(t) for t in self.top]]

    @classmethod
    def from_json(cls, obj: Any) -> TokenLogprob:
        """The inverse of to_json; ValueError when `obj` is not one."""
        try:
            token, logprob, top = obj
            alternatives = tuple((str(t), float(lp)) for t, lp in top)
            return cls(str(token), None if logprob is None else float(logprob), alternatives)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a token logprob: {obj!r}") from exc


Logprobs = tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str  # "" when the generation never finished
    completion_tokens: int
    prompt_tokens: int = 0
    model_revision: str | None = None  # None: the predictor reported none
    # Each token's logprobs, when the request asked for them (never cached: such requests bypass).
    logprobs: Logprobs | None = None
    # The prompt's tokens' logprobs (vLLM's prompt_logprobs, what completions' echo reports), when
    # asked for; never cached either.
    prompt_logprobs: Logprobs | None = None
    # A prompt given as token ids, as the text they decode to (what echo shows); None for text.
    prompt_text: str | None = None

    @property
    def complete(self) -> bool:
        return self.finish_reason in COMPLETE

    def with_revision(self, revision: str | None) -> Answer:
        """The answer labelled with the model revision that produced it, when one was reported."""
        return replace(self, model_revision=revision) if revision else self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
        }
        if self.model_revision:
            out["model_revision"] = self.model_revision
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Answer | None:
        """The Answer a stored JSON object holds, or None when it is not answer-shaped."""
        if not isinstance(obj, dict):
            return None
        text, reason = obj.get("text"), obj.get("finish_reason")
        if not isinstance(text, str) or not isinstance(reason, str) or "completion_tokens" not in obj:
            return None
        try:
            completion, prompt = int(obj["completion_tokens"]), int(obj.get("prompt_tokens") or 0)
        except (TypeError, ValueError):
            return None
        revision = obj.get("model_revision")
        return cls(text, reason, completion, prompt, str(revision) if revision else None)


@dataclass(frozen=True)
class Piece:
    """One step of an answer as it is generated: new text, and the counts so far. The last piece of
    a generation carries its finish reason (None before)."""

    text: str
    finish_reason: str | None
    completion_tokens: int  # so far
    prompt_tokens: int
    model_revision: str | None = None  # None: the predictor reports none
    logprobs: Logprobs | None = None  # the new tokens', when asked for
    prompt_logprobs: Logprobs | None = None  # the prompt's, when asked for: on the first piece only
    prompt_text: str | None = None  # a token-id prompt's text: on the first piece only


def answer_of(pieces: list[Piece]) -> Answer:
    """The answer a generation made: its pieces joined, the last one's counts and finish reason
    ("" when it never finished, which is not `complete`)."""
    last = pieces[-1] if pieces else None
    return Answer(
        text="".join(p.text for p in pieces),
        finish_reason=(last.finish_reason if last else None) or "",
        completion_tokens=last.completion_tokens if last else 0,
        prompt_tokens=max((p.prompt_tokens for p in pieces), default=0),
        model_revision=next((p.model_revision for p in pieces if p.model_revision), None),
        logprobs=None if all(p.logprobs is None for p in pieces)
        else tuple(t for p in pieces for t in p.logprobs or ()),
        prompt_logprobs=next((p.prompt_logprobs for p in pieces if p.prompt_logprobs is not None), None),
        prompt_text=next((p.prompt_text for p in pieces if p.prompt_text is not None), None),
    )


def step_of(piece: Piece) -> Answer:
    """A piece as the answer columns of one streamed v2 response: its new text and logprobs (and the
    prompt's, on the first), its finish reason ("" before the last) and the completion tokens so far."""
    return Answer(piece.text, piece.finish_reason or "", piece.completion_tokens, logprobs=piece.logprobs,
                  prompt_logprobs=piece.prompt_logprobs, prompt_text=piece.prompt_text)  # fmt: skip


def whole_piece(answer: Answer) -> Piece:
    """An answer as the one piece of a generation (a unary generation, a peer replica's answer)."""
    return Piece(answer.text, answer.finish_reason or None, answer.completion_tokens,
                 answer.prompt_tokens, answer.model_revision, answer.logprobs,
                 answer.prompt_logprobs, answer.prompt_text)  # fmt: skip


# Replayed hits arrive as word-sized pieces, like a generation would.
_WORDS = re.compile(r"\S+\s*|\s+")


def replay(answer: Answer) -> list[Piece]:
    """A cached answer as the pieces of a generation; the last carries the finish reason and the
    answer's counts. Stored answers keep no token boundaries, so the completion tokens so far of
    the pieces before are the answer's spread over its pieces (rising, never past the total)."""
    texts = _WORDS.findall(answer.text) or [""]
    last = len(texts) - 1
    return [
        Piece(
            text=t,
            finish_reason=answer.finish_reason if i == last else None,
            completion_tokens=answer.completion_tokens * (i + 1) // len(texts),
            prompt_tokens=answer.prompt_tokens,
            model_revision=answer.model_revision,
        )
        for i, t in enumerate(texts)
    ]
