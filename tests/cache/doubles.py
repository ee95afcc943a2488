"""Test doubles for the two pluggable parts of the cache (the real ones are cache.embedder and
cache.verify). Real, deterministic implementations, just simple."""

from __future__ import annotations

import asyncio
import hashlib
import re

import numpy as np

from cache.interfaces import Verdict


class HashingEmbedderDouble:
    """Test double: bag of lower-cased words hashed into `dim` signed buckets, L2-normalized.
    Paraphrases sharing most words land close together, unrelated prompts far apart."""

    def __init__(self, dim: int = 384, delay_s: float = 0.0) -> None:
        self.dim = dim
        self.delay_s = delay_s
        self.calls = 0

    async def embed(self, text: str) -> np.ndarray:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        n = float(np.linalg.norm(v))
        if n == 0.0:
            v[0], n = 1.0, 1.0
        return v / n


class ThresholdVerifierDouble:
    """Test double: accepts a candidate iff its similarity reaches the threshold."""

    def __init__(self, threshold: float = 0.8) -> None:
        self.threshold = threshold
        self.calls = 0

    def check(self, query: str, candidate: str, similarity: float) -> Verdict:
        self.calls += 1
        ok = similarity >= self.threshold
        return Verdict(
            ok, "threshold", similarity, f"{similarity:.3f} {'>=' if ok else '<'} {self.threshold}"
        )
