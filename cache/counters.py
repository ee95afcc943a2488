"""The semantic cache's counters, apart from SemanticCache so its helpers (cache.health, cache.lease,
the transformer's single flight) can count without importing it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class CacheCounters:
    """Plain counters; the transformer exports them (e.g. a Prometheus collector reading them)."""

    lookups: Counter[str] = field(default_factory=Counter)  # by status
    redis_errors: int = 0  # failed or timed-out Redis calls
    embed_errors: int = 0
    timeouts: int = 0  # lookups/stores that ran out of their budget (any phase)
    skipped_degraded: int = 0  # lookups/stores that did not try Redis because it is degraded
    stores: int = 0
    store_errors: int = 0
    index_created: int = 0
    verifier_rejections: int = 0
    verifier_errors: int = 0
    judge_calls: int = 0  # grey-zone scorer rejections asked again (cache.semantic_cache, with a judge)
    judge_accepts: int = 0  # of those, served on the judge's word
    judge_errors: int = 0  # judge calls that failed or timed out (each a rejection)
    internal_errors: int = 0  # bugs or corrupt entries, turned into status "error"
    singleflight_leaders: int = 0
    singleflight_joined: int = 0
    singleflight_wait_timeouts: int = 0
    degraded: bool = False
