"""What a cache lookup returns (cache.semantic_cache.SemanticCache.lookup): the status, the served answer
and how it was decided."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from cache.interfaces import Verdict
from cache.payload import Payload

Status = Literal["exact", "semantic", "miss", "bypass", "error"]


@dataclass
class LookupResult:
    status: Status
    answer: Payload | None = None
    similarity: float | None = None  # of the served entry; on a miss, of the best candidate seen
    verdict: Verdict | None = None  # the accepting verdict; on a miss, the best candidate's rejection
    entry_id: str | None = None
    cached_prompt: str | None = None  # the stored prompt of the served entry
    candidates: int = 0  # KNN results at or above min_similarity
    # ms: exact, embed, search, verify (judge within it, when asked), total
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why, when status == "error"
    # The embedding computed during the lookup: pass it to store() to avoid a second one.
    vector: np.ndarray | None = field(default=None, repr=False)

    @property
    def hit(self) -> bool:
        return self.status in ("exact", "semantic")
