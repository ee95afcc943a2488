"""RedisVL's `SemanticCache` as the peer of ours, on the same Redis, embedder and prompts.

RedisVL (0.28) accepts redis-py 8.1 (`redis>=6.3,!=8.0.0,<9`), so it runs in the project venv, in
the bench process: no second interpreter, same event of noise for both caches. Its vectorizer is a
`CustomTextVectorizer` over our `cache.embedder.Embedder`, so both caches search with the very same
vectors; only the cache logic (and its client-side overhead) differs.

Functions here never time anything against ours by themselves; bench/cache.py interleaves the calls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from semserve.tooling.cache_eval import Outcome, Pair, Report, summarize

DEFAULT_DISTANCE_THRESHOLD = 0.1  # RedisVL's default: cosine distance, i.e. similarity >= 0.9


class MissingRedisVL(RuntimeError):
    pass


def _import() -> Any:
    try:
        import redisvl
        from redisvl.extensions.cache.llm import SemanticCache
        from redisvl.query.filter import Tag
        from redisvl.utils.vectorize import CustomTextVectorizer
    except ImportError as e:
        raise MissingRedisVL(
            "redisvl is not installed: .venv/bin/pip install 'redisvl>=0.28,<0.29' "
            "(or run with --skip-redisvl)"
        ) from e
    return redisvl, SemanticCache, Tag, CustomTextVectorizer


def version() -> str:
    return str(_import()[0].__version__)


class Peer:
    """One RedisVL SemanticCache (its own index) whose vectorizer is our embedder."""

    def __init__(
        self,
        redis_url: str,
        embedder: Any,
        name: str,
        distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
        filterable: bool = False,
    ) -> None:
        _, semantic_cache, tag, custom = _import()
        self._tag = tag

        def embed(text: str, **_: Any) -> list[float]:
            return [float(x) for x in embedder.embed_many([text])[0]]

        def embed_many(texts: list[str], **_: Any) -> list[list[float]]:
            return [[float(x) for x in row] for row in embedder.embed_many(texts)]

        self.vectorizer = custom(embed=embed, embed_many=embed_many)
        self.cache = semantic_cache(
            name=name,
            distance_threshold=distance_threshold,
            vectorizer=self.vectorizer,
            redis_url=redis_url,
            overwrite=True,
            filterable_fields=[{"name": "pair", "type": "tag"}] if filterable else None,
        )
        self.distance_threshold = distance_threshold

    def store(self, prompt: str, response: str, vector: np.ndarray | None = None,
              pair: int | None = None) -> str:
        return str(self.cache.store(
            prompt=prompt,
            response=response,
            vector=None if vector is None else [float(x) for x in vector],
            filters=None if pair is None else {"pair": str(pair)},
        ))

    def check(self, prompt: str | None = None, vector: np.ndarray | None = None,
              pair: int | None = None) -> list[dict[str, Any]]:
        return list(self.cache.check(
            prompt=prompt,
            vector=None if vector is None else [float(x) for x in vector],
            filter_expression=None if pair is None else self._tag("pair") == str(pair),
        ))

    def timed_check(self, prompt: str) -> tuple[float, bool]:
        """ms for one check(prompt) (embedding included, as a RedisVL user calls it), and hit?"""
        t = time.perf_counter()
        hits = self.check(prompt=prompt)
        return (time.perf_counter() - t) * 1000.0, bool(hits)

    def timed_check_vector(self, vector: np.ndarray) -> tuple[float, bool]:
        """ms for one check(vector=...): RedisVL's search and client overhead, no embedding."""
        t = time.perf_counter()
        hits = self.check(vector=vector)
        return (time.perf_counter() - t) * 1000.0, bool(hits)

    def delete(self) -> None:
        try:
            self.cache.delete()
        finally:
            self.cache.disconnect()


def evaluate(
    pairs: Sequence[Pair],
    vectors: dict[str, np.ndarray],
    redis_url: str,
    embedder: Any,
    distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
    name: str = "bench_redisvl_eval",
) -> Report:
    """The labelled pairs through RedisVL, isolated per pair like
    semserve.tooling.cache_eval.evaluate_through_cache does with a fresh tenant: `a` is stored with
    tag pair=i, `b` is checked with a filter pair == i.
    Served = RedisVL returned a hit (the filter makes it `a`'s)."""
    peer = Peer(redis_url, embedder, name, distance_threshold, filterable=True)
    outs: list[Outcome] = []
    try:
        for i, p in enumerate(pairs):
            peer.store(p.a, f"answer to: {p.a}", vectors[p.a], pair=i)
            hits = peer.check(vector=vectors[p.b], pair=i)
            dist = float(hits[0].get("vector_distance", "nan")) if hits else float("nan")
            outs.append(Outcome(p, bool(hits), "redisvl", 1.0 - dist, f"distance <= {distance_threshold}"))
    finally:
        peer.delete()
    return summarize(f"redisvl d<={distance_threshold:g}", outs)
