"""Transformer metrics: what the cache decided, how long it took, what it saved."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cache.epoch import SharedEpoch
    from cache.lease import LeaseCounters
    from cache.semantic_cache import SemanticCache

LOOKUPS = Counter(
    "semserve_cache_lookups_total",
    "Cache lookups by result (exact, semantic, miss, bypass, error).",
    ("model_name", "result"),
)
LOOKUP_SECONDS = Histogram(
    "semserve_cache_lookup_seconds",
    "Time of one cache lookup (exact GET, embedding, KNN, verification).",
    ("model_name",),
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25),
)
EMBED_SECONDS = Histogram(
    "semserve_cache_embedding_seconds",
    "Time to embed the last user message during a lookup.",
    ("model_name",),
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1),
)
SIMILARITY = Histogram(
    "semserve_cache_similarity",
    "Cosine similarity of the best semantic candidate, by whether it was served.",
    ("model_name", "decision"),
    buckets=(0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0),
)
PREDICTOR_CALLS_SAVED = Counter(
    "semserve_cache_predictor_calls_saved_total",
    "Requests answered without calling the predictor (cache hits and single-flight joins).",
    ("model_name",),
)
STORE_SKIPPED = Counter(
    "semserve_cache_store_skipped",
    "Complete answers served but not cached, by reason (revision_mismatch: the predictor reported "
    "another model revision than the transformer's --expected-model-revision, e.g. during a canary).",
    ("model_name", "reason"),
)
PREDICTOR_CALLS = Counter(
    "semserve_transformer_predictor_calls_total",
    "Calls to the predictor by protocol and outcome.",
    ("model_name", "protocol", "outcome"),
)
SPECULATIONS = Counter(
    "semserve_speculation_total",
    "Predictor streams started on an exact miss, before the semantic lookup decided, by outcome "
    "(used: the lookup missed and the stream was the answer; cancelled: a semantic hit, the stream "
    "was aborted and never stored).",
    ("model_name", "outcome"),
)
SPECULATION_CANCELLED_TOKENS = Counter(
    "semserve_speculation_cancelled_tokens_total",
    "Tokens the predictor generated for speculations that a semantic hit cancelled (wasted work).",
    ("model_name",),
)
REQUEST_SECONDS = Histogram(
    "semserve_transformer_request_duration_seconds",
    "Time to answer a request, by protocol and cache result.",
    ("model_name", "protocol", "cache"),
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


# The outcomes of a predictor call: a small fixed set, so a dashboard can sum them and an alert
# can divide by them (an exception class name per outcome would grow with every error type).
OUTCOMES = ("ok", "client_error", "unavailable", "cancelled", "error")
_CLIENT_CODES = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                 "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "PERMISSION_DENIED", "ALREADY_EXISTS"}  # fmt: skip
_UNAVAILABLE_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED"}


def outcome_of(exc: BaseException) -> str:
    """The `outcome` label of a failed predictor call (`ok` is the caller's when nothing failed).

    client_error: the predictor refused the request (4xx / INVALID_ARGUMENT ...), a client's fault;
    unavailable: the predictor is down, loading, draining or too slow (503/504 / UNAVAILABLE ...);
    cancelled: the caller went away; error: anything else (a 500, a bug)."""
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    status = getattr(exc, "http_status", None)  # semserve.errors.ServingError and its kind
    if isinstance(status, int):
        if status in (503, 504):
            return "unavailable"
        if status == 499:
            return "cancelled"
        return "client_error" if 400 <= status < 500 else "error"
    code = getattr(exc, "code", None)  # grpc.aio.AioRpcError
    if callable(code):
        try:
            name = getattr(code(), "name", "")
        except Exception:  # a `code` that is not gRPC's; fall through to "error"
            name = ""
        if name == "CANCELLED":
            return "cancelled"
        if name in _UNAVAILABLE_CODES:
            return "unavailable"
        if name in _CLIENT_CODES:
            return "client_error"
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return "unavailable"
    return "error"


class PolicyCollector(Collector):
    """Exports the cache policy's plain counters (cache/ has no Prometheus dependency)."""

    def __init__(
        self,
        model: str,
        counters: Any,
        lease: LeaseCounters | None = None,
        epoch: SharedEpoch | None = None,
    ) -> None:
        self.model = model
        self.counters = counters
        self.lease = lease  # None: no cross-replica single flight
        self.epoch = epoch  # None: no shared epoch (the setting alone)

    def collect(self) -> Iterator[Any]:
        c = self.counters
        rows = {
            "semserve_cache_redis_errors": ("Failed or timed-out Redis calls.", c.redis_errors),
            "semserve_cache_entries_stored": ("Answers written to the cache.", c.stores),
            "semserve_cache_store_errors": ("Answers that could not be written.", c.store_errors),
            "semserve_cache_timeouts": ("Lookups or stores over their time budget.", c.timeouts),
            "semserve_cache_singleflight_waiters": (
                "Requests that waited for an identical in-flight miss instead of calling the "
                "predictor.", c.singleflight_joined,
            ),
            "semserve_cache_verifier_rejections": (
                "Semantic candidates the verifier rejected.", c.verifier_rejections,
            ),
            "semserve_cache_index_created": ("Times the index was (re)created.", c.index_created),
            # The optional same-answer judge (--cache-judge): zero while it is off.
            "semserve_cache_judge_calls": (
                "Grey-zone candidates the scorer rejected that were asked of the judge.", c.judge_calls,
            ),
            "semserve_cache_judge_accepts": ("Judge calls that served the candidate.", c.judge_accepts),
            "semserve_cache_judge_errors": (
                "Judge calls that failed or timed out (each a rejection).", c.judge_errors,
            ),
        }
        for name, (doc, value) in rows.items():
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric([self.model], float(value))
            yield fam
        degraded = GaugeMetricFamily(
            "semserve_cache_degraded", "1 while Redis is unreachable and the cache fails open.",
            labels=["model_name"],
        )
        degraded.add_metric([self.model], 1.0 if c.degraded else 0.0)
        yield degraded
        if self.lease is not None:
            yield from self._lease_families(self.lease)
        if self.epoch is not None:
            epoch = GaugeMetricFamily(
                "semserve_cache_epoch",
                "The cache epoch this replica reads and writes under (max of --cache-epoch and the "
                "value shared in Redis); replicas that disagree are mid-bump.",
                labels=["model_name"],
            )
            epoch.add_metric([self.model], float(self.epoch.current(self.model)))
            yield epoch

    def _lease_families(self, lease: LeaseCounters) -> Iterator[Any]:
        """Cross-replica single flight (cache/lease.py): how each claim of a lease ended."""
        outcomes = CounterMetricFamily(
            "semserve_cache_singleflight_leases",
            "Cross-replica single-flight claims by outcome: led (took the lease and generated), "
            "answered (a peer replica's stored answer was served), wait_ran_out (waited "
            "--cache-singleflight-wait-s, then generated alone), unavailable (Redis failed: alone).",
            labels=["model_name", "outcome"],
        )
        for outcome, value in (
            ("led", lease.leaders),
            ("answered", lease.answered),
            ("wait_ran_out", lease.wait_timeouts),
            ("unavailable", lease.unavailable),
        ):
            outcomes.add_metric([self.model, outcome], float(value))
        yield outcomes
        takeovers = CounterMetricFamily(
            "semserve_cache_singleflight_lease_takeovers",
            "Leases taken after the previous holder gave up or died (counted in outcome led too).",
            labels=["model_name"],
        )
        takeovers.add_metric([self.model], float(lease.takeovers))
        yield takeovers


def register_policy(model: str, cache: SemanticCache) -> None:
    """Export `cache`'s counters, its cross-replica lease outcomes and its epoch."""
    lease = cache.replica_flights.counters if cache.replica_flights is not None else None
    REGISTRY.register(PolicyCollector(model, cache.counters, lease, cache.epochs))


# -- per-tenant limits (transformers_svc/admission.py) ---------------------------------------------
TENANT_REFUSED = Counter(
    "semserve_tenant_refused_total",
    "Requests refused (429/503, before any work) by tenant and reason: requests_per_minute, "
    "tokens_per_minute, max_concurrent (the tenant's own limits), fair_share, saturated (the fair "
    "queue).",
    ("model_name", "tenant", "reason"),
)
TENANT_TOKENS_ADMITTED = Counter(
    "semserve_tenant_tokens_admitted_total",
    "Tokens misses reserved on admission (estimated prompt tokens + max_tokens).",
    ("model_name", "tenant"),
)
TENANT_TOKENS_USED = Counter(
    "semserve_tenant_tokens_used_total",
    "Real prompt + completion tokens of the tenant's predictor generations (as usage reports them).",
    ("model_name", "tenant"),
)
TENANT_LIMITS_FAIL_OPEN = Counter(
    "semserve_tenant_limits_fail_open_total",
    "Limit checks passed unchecked because Redis was down or slow (limits fail open).",
    ("model_name",),
)


# -- misses held while the predictor is not ready (transformers_svc/held_misses.py) ---------------
HELD_MISSES = Gauge(
    "semserve_held_misses",
    "Misses waiting now for a predictor that is not ready (--predictor-hold-s), by tenant.",
    ("model_name", "tenant"),
)
HELD_MISSES_REFUSED = Counter(
    "semserve_held_misses_refused_total",
    "Misses refused (503 with Retry-After) because the tenant had --held-misses-per-tenant held.",
    ("model_name", "tenant"),
)
PREDICTOR_START_ESTIMATE = Gauge(
    "semserve_predictor_start_estimate_seconds",
    "How long the predictor takes from the first held miss to ready: --predictor-start-s until a "
    "start was measured, then the last one measured (refusals' Retry-After comes from it).",
    ("model_name",),
)


# -- the fair queue (transformers_svc/fair_queue.py) -------------------------------------------------
ADMISSION_QUEUE_SECONDS = Histogram(
    "semserve_admission_queue_seconds",
    "Time a miss waited in the fair queue for its turn and room at the predictor, by tenant.",
    ("model_name", "tenant"),
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ADMISSION_QUEUE_DEPTH = Gauge(
    "semserve_admission_queue_depth",
    "Misses waiting now in the fair queue for their turn and room at the predictor.",
    ("model_name",),
)
