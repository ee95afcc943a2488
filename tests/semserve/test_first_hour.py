"""Issue 18, "the first hour": what a newcomer trips over, checked through the real services."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import Transformer


def _chat(t: Transformer, content: str) -> httpx.Response:
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 8}  # fmt: skip
    r = httpx.post(f"{t.openai_base}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_sentence_case_is_an_exact_hit(transformer: Transformer) -> None:
    """The README's "normalized last user message": a lower-case first letter is the same question,
    found by the exact key (one Redis read), not by a semantic match at similarity 1.0."""
    ref = uuid.uuid4().hex[:6]
    first = _chat(transformer, f"Why is the sky blue? (ref {ref})")
    assert first.headers["x-semserve-cache"] == "miss"
    again = _chat(transformer, f"why is the sky blue? (ref {ref})")
    assert again.headers["x-semserve-cache"] == "exact"
    answer = first.json()["choices"][0]["message"]["content"]
    assert again.json()["choices"][0]["message"]["content"] == answer
