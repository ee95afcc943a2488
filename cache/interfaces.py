"""The pluggable parts of the semantic cache, as protocols: the cache policy (cache.semantic_cache)
depends only on these, the real implementations live in cache.embedder and cache.verify (and, for
the optional same-answer judge, in transformers_svc.judge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Turns the last user message into the vector the cache searches with."""

    # Vector length; checked against the index schema when the cache is built. Implementations
    # without the attribute are accepted and checked on the first vector instead.
    dim: int

    async def embed(self, text: str) -> np.ndarray:
        """A 1-D float32 vector of length `dim`, L2-normalized. Must not block the event loop."""
        ...


@dataclass(frozen=True)
class Verdict:
    """A verifier's decision on one candidate."""

    accept: bool
    rule: str  # which rule decided, e.g. "similarity", "negation", "number_mismatch"
    score: float  # the score that rule used (a similarity, a cross-encoder logit, ...)
    detail: str = ""  # human-readable reason, logged and shown by `cache eval`


@runtime_checkable
class Verifier(Protocol):
    """Decides whether a cached prompt's answer may be served for the query.

    Called on the event loop, best candidate first, at most `knn_k` times per lookup: it should be
    cheap (rules, a small model well under a millisecond per pair) or the lookup budget suffers.
    """

    def check(self, query: str, candidate: str, similarity: float) -> Verdict: ...


@runtime_checkable
class Judge(Protocol):
    """Optional second opinion on a candidate the scorer rejected by score in its grey zone: do the
    two prompts have the same answer? Asked at most once per lookup, under the cache's
    `judge_timeout_ms`.

    Async and must not block the event loop (it is a model call, e.g. the predictor's). Any
    exception or a timeout means reject: the lookup is then a miss, never a wrong answer.
    """

    async def same_answer(self, query: str, cached: str) -> float:
        """P(the answer cached for `cached` is right for `query`), in [0, 1]."""
        ...
