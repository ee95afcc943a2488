"""The answer the services cache: a generation's text result plus the model revision that made it,
and the one place it is turned into the JSON stored in Redis and back.

The stored JSON is {"text", "finish_reason", "completion_tokens", "prompt_tokens"} plus
"model_revision" when the predictor reported one: the format entries have always had, so entries
written before this type existed are read as Answers. The cache itself stays a store of JSON
payloads: a payload that is not answer-shaped (the cache eval's markers, a test's {"text": ...})
round-trips as the plain object it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

COMPLETE = ("stop", "length")  # finish reasons of a whole answer (not cut off, not failed)


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str  # "" when the generation never finished
    completion_tokens: int
    prompt_tokens: int = 0
    model_revision: str | None = None  # None: the predictor reported none

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


# What the cache stores: an Answer, or any other JSON-able object (opaque to the cache).
Payload = Answer | dict[str, Any]


def dumps(payload: Payload) -> str:
    """The JSON text stored in Redis."""
    obj = payload.to_json() if isinstance(payload, Answer) else payload
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def loads(text: str) -> Payload:
    """The stored payload: an Answer when the JSON is one, else the decoded object as it was."""
    obj = json.loads(text)
    answer = Answer.from_json(obj)
    return answer if answer is not None else obj
