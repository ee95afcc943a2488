"""What the cache stores and the one place it is turned into the JSON kept in Redis and back: an
Answer (semserve/answer.py), or any other JSON-able object. The cache stays a store of JSON payloads:
a payload that is not answer-shaped (the cache eval's markers, a test's {"text": ...}) round-trips as
the plain object it was; entries written before Answer existed are read as Answers.
"""

from __future__ import annotations

import json
from typing import Any

from semserve.answer import Answer

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
