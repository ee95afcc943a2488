"""Settings of the semantic cache (env SEMSERVE_CACHE_*), shared by the transformer and the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cache.schema import DEFAULT_DIM, SCHEMA_VERSION
from semserve.config import Settings, setting


@dataclass
class CacheSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_CACHE_"
    # A code constant, not a knob: it changes when the layout or the fingerprint recipe changes.
    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION

    enabled: bool = setting(True, "Use the cache at all; off makes every lookup a bypass.")
    redis_url: str = setting("redis://127.0.0.1:6380/0", "Redis (with RediSearch) URL.")
    redis_password: str = setting("", "Redis password (AUTH), if not in the URL.", secret=True)
    ca_file: Path | None = setting(
        None,
        "CA bundle (PEM) that verifies the Redis server's certificate; needs a rediss:// URL. "
        "Empty with rediss://: the system CAs.",
    )
    deployment: str = setting(
        "default", "Deployment name: part of the index name and key prefix, so deployments never mix."
    )
    embedding_dim: int = setting(DEFAULT_DIM, "Vector length of the embedder (index schema).")
    ttl_seconds: int = setting(86400, "Fixed lifetime of an entry from its creation; reads never extend it.")
    max_entries_per_tenant: int = setting(10000, "Per-tenant cap; the oldest entries are evicted.")
    lookup_timeout_ms: float = setting(
        50.0,
        "Budget of each Redis round trip of a lookup (exact GET, KNN); past it the request skips "
        "the cache.",
    )
    embed_timeout_ms: float = setting(
        1000.0,
        "Budget of the embedding in a lookup (CPU-bound: it sets how long a busy pod may spend "
        "before answering the request as a miss).",
    )
    store_timeout_ms: float = setting(500.0, "Budget of one store; also the Redis socket timeout.")
    singleflight_wait_s: float = setting(
        60.0,
        "How long identical concurrent misses wait for the first one's answer before producing their own.",
    )
    knn_k: int = setting(5, "Nearest neighbours fetched per semantic lookup.")
    min_similarity: float = setting(
        0.70, "Cosine similarity floor: candidates below it are not even given to the verifier."
    )
    epoch: int = setting(
        0,
        "Cache epoch, part of every key: bumping it makes all older entries unreadable at once "
        "(they expire by TTL). `semserve tenant promote` bumps it, so the old model's answers are "
        "not served after a promotion.",
    )
    degrade_after_timeouts: int = setting(
        3,
        "Consecutive Redis timeouts before Redis is taken out of the path (refused connections: at "
        "once); a single slow call only turns that one request into a miss.",
    )
    degraded_retry_s: float = setting(
        1.0, "While Redis is failing, requests skip it and one probe is let through this often."
    )
    max_wrong_rate: float = setting(
        0.01,
        "Error budget of semantic hits: the verifier's scorer serves at the threshold whose share of "
        "look-alikes served on the calibration pairs is at most this (0.01 = 1 percent). Lower: fewer wrong "
        "answers and fewer hits. See `semserve cache eval` and README 'Choosing the error budget'.",
    )
