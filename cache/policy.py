"""The cache policy: when to read, what to serve, when to write, and what to do when Redis fails.

Kept apart from the layout (cache.schema, cache.store) and from the models (cache.interfaces), so
each can change alone.

Lookup: exact key first (one Redis read, no embedding); then embed, KNN over entries with the same
tenant + model + fingerprint, and the verifier on candidates best-first; the first accepted one is
served. Candidates under `min_similarity` are not even verified.

Fail open: each Redis round trip of a lookup runs under `lookup_timeout_ms`, the embedding under
`embed_timeout_ms`, every store under `store_timeout_ms`.
A Redis error or timeout makes the lookup return status "error" (the caller goes
to the predictor), bumps a counter, and marks the cache degraded with ONE log line. While degraded,
requests skip Redis entirely and one probe is let through every `degraded_retry_s`; the first
success logs the recovery and recreates the index if Redis came back empty.

Single flight (`run_once`): concurrent identical misses in this process (same exact key) call
`produce` once; the others wait up to `singleflight_wait_s` for its answer. Decisions:
- if the leader's `produce` raises, the waiters get the same exception: it is the same request, so
  the same failure is the likely outcome, and N retries would hit a predictor that is already
  failing. The client may retry.
- if the leader is cancelled (its client went away), the waiters are not: they form a new flight,
  one of them becomes the leader.
- a waiter whose wait runs out calls its own `produce` (bounded wait, never a hang).
Across replicas (cache/lease.py, `singleflight_replicas`): this process's leader of a key first
takes a lease in Redis; when another replica holds it, it waits for that replica's stored answer
and serves it. Only flights whose answer would be stored take part.

Tracing (OpenTelemetry API only, through semserve.tracing; no-ops unless the request is traced):
`semserve.cache.lookup` with children HMGET (exact), `semserve.cache.embed`, FT.SEARCH (KNN) and
`semserve.cache.verify` (the decision); `semserve.cache.singleflight.wait` for a request that joins
a flight; `semserve.cache.store` with its EVALSHA. Redis spans follow the DB semantic conventions.
No prompt text on any span unless the transformer runs with --record-prompt-text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
from redis.exceptions import BusyLoadingError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cache import keys
from cache.answer import Payload
from cache.epoch import SharedEpoch
from cache.interfaces import Embedder, Verdict, Verifier
from cache.keys import CacheRequest
from cache.lease import Claim, ReplicaFlights
from cache.settings import CacheSettings
from cache.store import RedisCacheStore, is_missing_index
from semserve import tracing
from semserve.logs import get_logger

log = get_logger("cache.policy")

Status = Literal["exact", "semantic", "miss", "bypass", "error"]
T = TypeVar("T")

# Redis unreachable or not serving: these trip the degraded state. Other ResponseErrors (e.g. OOM
# on a write) mean Redis answers; they are counted and logged but do not stop lookups.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError, TimeoutError)


@dataclass
class LookupResult:
    status: Status
    answer: Payload | None = None
    similarity: float | None = None  # of the served entry; on a miss, of the best candidate seen
    verdict: Verdict | None = None  # the accepting verdict; on a miss, the best candidate's rejection
    entry_id: str | None = None
    cached_prompt: str | None = None  # the stored prompt of the served entry
    candidates: int = 0  # KNN results at or above min_similarity
    timings: dict[str, float] = field(default_factory=dict)  # ms: exact, embed, search, verify, total
    error: str | None = None  # why, when status == "error"
    # The embedding computed during the lookup: pass it to store()/run_once() to avoid a second one.
    vector: np.ndarray | None = field(default=None, repr=False)

    @property
    def hit(self) -> bool:
        return self.status in ("exact", "semantic")


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
    internal_errors: int = 0  # bugs or corrupt entries, turned into status "error"
    singleflight_leaders: int = 0
    singleflight_joined: int = 0
    singleflight_wait_timeouts: int = 0
    degraded: bool = False


class _LeaderCancelled(Exception):
    pass


class _Phase:
    """Which step a lookup is in, so a deadline hit can be blamed on Redis or on the embedder."""

    def __init__(self) -> None:
        self.name = "start"


class SemanticCache:
    def __init__(
        self,
        store: RedisCacheStore,
        embedder: Embedder,
        verifier: Verifier,
        settings: CacheSettings,
    ) -> None:
        dim = getattr(embedder, "dim", None)
        if dim is not None and int(dim) != store.schema.dim:
            raise ValueError(f"embedder dim {dim} != index dim {store.schema.dim}")
        self._entries = store
        self.embedder = embedder
        self.verifier = verifier
        self.settings = settings
        self.counters = CacheCounters()
        self._probe_at = 0.0
        self._timeouts_in_a_row = 0
        self._failing: dict[str, str] = {}  # component -> last error, for one log line per change
        self._flights: dict[str, asyncio.Future[Any]] = {}
        self._db_attrs = _redis_attributes(store)
        client = getattr(store, "client", None)  # test doubles may have no Redis
        self.replica_flights = (
            ReplicaFlights(client, store.schema.index_name, lease_ms=settings.singleflight_lease_ms,
                           op_timeout_s=settings.store_timeout_ms / 1000.0)
            if settings.singleflight_replicas and client is not None else None
        )  # fmt: skip
        # The epoch shared by the replicas (cache/epoch.py); without Redis, the setting alone.
        self.epochs = (
            SharedEpoch(client, store.schema.index_name, floor=settings.epoch,
                        refresh_s=settings.epoch_refresh_s, op_timeout_s=settings.store_timeout_ms / 1000.0)
            if client is not None else None
        )  # fmt: skip

    def _redis_span(self, operation: str, target: str | None = None) -> Any:
        name = f"{operation} {target}" if target else operation
        return tracing.span(name, tracing.SpanKind.CLIENT, db__operation__name=operation, **self._db_attrs)

    @property
    def entries(self) -> RedisCacheStore:
        """The Redis store of this cache's entries, for what works on entries rather than on one
        request: stats, flush, inspect (the admin routes). Not `store`: that method writes an answer."""
        return self._entries

    @property
    def degraded(self) -> bool:
        return self.counters.degraded

    # -- health ------------------------------------------------------------------------------------

    def _fail(self, component: str, exc: BaseException | str, per_message: bool = False) -> None:
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        if component not in self._failing or (per_message and self._failing[component] != msg):
            log.warning("cache_degraded", component=component, error=msg)
        self._failing[component] = msg

    def _recovered(self, component: str) -> None:
        if self._failing.pop(component, None) is not None:
            log.info("cache_recovered", component=component)

    def _redis_down(self, exc: BaseException | str, timeout: bool = False) -> None:
        self.counters.redis_errors += 1
        if timeout:
            # One slow round trip may be this process starved of CPU, not Redis: only consecutive
            # timeouts take Redis out of the path. Refused connections do at once.
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row < self.settings.degrade_after_timeouts:
                return
        self.counters.degraded = True
        self._probe_at = time.monotonic() + self.settings.degraded_retry_s
        self._fail("redis", exc)

    def _redis_allowed(self) -> bool:
        if not self.counters.degraded:
            return True
        now = time.monotonic()
        if now >= self._probe_at:
            self._probe_at = now + self.settings.degraded_retry_s  # one probe per interval
            return True
        self.counters.skipped_degraded += 1
        return False

    async def _redis_up(self) -> None:
        self._timeouts_in_a_row = 0
        if not self.counters.degraded:
            return
        self.counters.degraded = False
        self._recovered("redis")
        # Redis may be a fresh, empty instance now.
        await self.ensure_index()

    async def ensure_index(self) -> bool:
        """Create the index if missing. Never raises for Redis failures (returns False)."""
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000.0):
                created = await self._entries.ensure_index()
        except (RedisError, *_UNREACHABLE) as e:
            self._redis_down(e)
            return False
        if created:
            self.counters.index_created += 1
        return created

    async def start(self) -> None:
        """Best effort at startup: the service starts even if Redis is not there yet."""
        if self.settings.enabled:
            await self.ensure_index()
            if self.epochs is not None:
                self.epochs.start()

    async def close(self) -> None:
        if self.epochs is not None:
            await self.epochs.close()
        await self._entries.close()

    # -- lookup ------------------------------------------------------------------------------------

    def _scoped(self, req: CacheRequest) -> CacheRequest:
        """The request in this cache's epoch: the cache owns it, so no caller can read across it."""
        epoch = self.epochs.current(req.model) if self.epochs is not None else self.settings.epoch
        return req if req.epoch == epoch else dataclasses.replace(req, epoch=epoch)

    async def _read_epoch(self, req: CacheRequest, budget_s: float) -> CacheRequest:
        """`req` in the shared epoch of its model, read from Redis by the first request for that
        model (afterwards it is refreshed in the background). Raises like any Redis call of a lookup
        or store, which then fails open: never a read or write under an epoch not yet checked, which
        could be older than the shared one."""
        if self.epochs is not None and not self.epochs.knows(req.model):
            await self.epochs.ensure(req.model, budget_s)
            req = self._scoped(req)
        return req

    def _skip(self, req: CacheRequest) -> bool:
        return not self.settings.enabled or req.bypass or not keys.normalize_text(req.prompt)

    def _finish(self, res: LookupResult, t0: float) -> LookupResult:
        res.timings["total"] = (time.perf_counter() - t0) * 1000.0
        self.counters.lookups[res.status] += 1
        log.debug(
            "cache_lookup",
            status=res.status,
            similarity=res.similarity,
            rule=res.verdict.rule if res.verdict else None,
            timings={k: round(v, 3) for k, v in res.timings.items()},
            error=res.error,
        )
        return res

    async def lookup(self, req: CacheRequest) -> LookupResult:
        req = self._scoped(req)
        with tracing.span("semserve.cache.lookup", semserve__cache__kind=req.kind) as span:
            res = await self._traced_lookup(req)
            if span.is_recording():
                span.set_attributes(tracing.clean_attributes({
                    "semserve.cache.status": res.status,
                    "semserve.cache.similarity": res.similarity,
                    "semserve.cache.candidates": res.candidates,
                    "semserve.cache.entry_id": res.entry_id,
                    "semserve.cache.error": res.error,
                }))
                if tracing.prompt_text_allowed():
                    span.set_attribute("semserve.cache.prompt", req.prompt)
                    if res.cached_prompt is not None:
                        span.set_attribute("semserve.cache.cached_prompt", res.cached_prompt)
                if res.status == "error":
                    tracing.fail(span, res.error or "error")
            return res

    async def _traced_lookup(self, req: CacheRequest) -> LookupResult:
        t0 = time.perf_counter()
        if self._skip(req):
            return self._finish(LookupResult("bypass"), t0)
        if not self._redis_allowed():
            return self._finish(LookupResult("error", error="degraded"), t0)
        res = LookupResult("miss")
        phase = _Phase()
        try:
            await self._lookup(req, res, phase)
        except TimeoutError:
            self.counters.timeouts += 1
            res = LookupResult("error", timings=res.timings, error=f"timeout in {phase.name}")
            if phase.name == "embed":
                self.counters.embed_errors += 1
                self._fail("embedder", res.error)
            else:
                self._redis_down(res.error, timeout=True)
        except RedisError as e:
            res = LookupResult("error", timings=res.timings, error=f"{type(e).__name__} in {phase.name}")
            if isinstance(e, _UNREACHABLE):
                self._redis_down(e)
            else:
                self.counters.redis_errors += 1
                self._fail("redis_command", e)
        except OSError as e:
            res = LookupResult("error", timings=res.timings, error=f"{type(e).__name__} in {phase.name}")
            self._redis_down(e)
        except _EmbedError as e:
            res = LookupResult("error", timings=res.timings, error=f"embedder: {e.__cause__!r}")
            self.counters.embed_errors += 1
            self._fail("embedder", e.__cause__ or e)
        except Exception as e:
            # A bug or a corrupt entry must cost a cache miss, never the request.
            res = LookupResult("error", timings=res.timings, error=f"{type(e).__name__} in {phase.name}")
            self.counters.internal_errors += 1
            self._fail("internal", e, per_message=True)
        return self._finish(res, t0)

    async def _lookup(self, req: CacheRequest, res: LookupResult, phase: _Phase) -> None:
        t = time.perf_counter()
        phase.name = "exact"
        # Redis round trips get the tight budget (a slow Redis must cost only milliseconds); the
        # embedding gets its own, since CPU contention, not Redis, decides how long it takes.
        redis_budget = self.settings.lookup_timeout_ms / 1000.0
        phase.name = "epoch"
        req = await self._read_epoch(req, redis_budget)
        phase.name = "exact"
        with self._redis_span("HMGET") as span:
            async with asyncio.timeout(redis_budget):
                hit = await self._entries.get_exact(req)
            span.set_attribute("semserve.cache.exact_hit", hit is not None)
        res.timings["exact"] = (time.perf_counter() - t) * 1000.0
        await self._redis_up()
        if hit is not None:
            res.status, res.answer, res.similarity = "exact", hit.answer, 1.0
            res.entry_id, res.cached_prompt = hit.entry_id, hit.prompt
            return

        t = time.perf_counter()
        phase.name = "embed"
        with tracing.span("semserve.cache.embed"):
            async with asyncio.timeout(self.settings.embed_timeout_ms / 1000.0):
                res.vector = await self._embed(req.prompt)
        res.timings["embed"] = (time.perf_counter() - t) * 1000.0

        t = time.perf_counter()
        phase.name = "search"
        with self._redis_span("FT.SEARCH", self._entries.schema.index_name) as span:
            try:
                async with asyncio.timeout(redis_budget):
                    candidates = await self._entries.search(req, res.vector, self.settings.knn_k)
            except ResponseError as e:
                if not is_missing_index(e):
                    raise
                # Redis restarted empty without us seeing it fail: recreate, and this one is a miss.
                await self.ensure_index()
                candidates = []
            span.set_attribute("db.response.returned_rows", len(candidates))
        res.timings["search"] = (time.perf_counter() - t) * 1000.0

        t = time.perf_counter()
        phase.name = "verify"
        candidates = [c for c in candidates if c.similarity >= self.settings.min_similarity]
        res.candidates = len(candidates)
        with tracing.span("semserve.cache.verify", semserve__cache__candidates=len(candidates)) as span:
            for c in candidates:  # best first
                verdict = self._verify(req.prompt, c.prompt, c.similarity)
                if verdict.accept:
                    res.status, res.answer, res.verdict = "semantic", c.answer, verdict
                    res.similarity, res.entry_id, res.cached_prompt = c.similarity, c.entry_id, c.prompt
                    break
                self.counters.verifier_rejections += 1
                if res.verdict is None:
                    res.similarity, res.verdict = c.similarity, verdict
            if span.is_recording():
                # served: a candidate was accepted; rejected: every candidate was turned down (the
                # best one's rule is given); none: nothing similar enough to verify.
                decision = "served" if res.status == "semantic" else "rejected" if candidates else "none"
                span.set_attributes(tracing.clean_attributes({
                    "semserve.cache.decision": decision,
                    "semserve.cache.rule": res.verdict.rule if res.verdict else None,
                    "semserve.cache.score": res.verdict.score if res.verdict else None,
                    "semserve.cache.similarity": res.similarity,
                }))
        res.timings["verify"] = (time.perf_counter() - t) * 1000.0

    def _verify(self, query: str, candidate: str, similarity: float) -> Verdict:
        try:
            self._apply_error_budget()
            verdict = self.verifier.check(query, candidate, similarity)
        except Exception as e:
            # A verifier that cannot decide rejects: serving a wrong answer is worse than a miss.
            self.counters.verifier_errors += 1
            self._fail("verifier", e, per_message=True)
            return Verdict(False, "verifier_error", similarity, f"{type(e).__name__}: {e}")
        self._recovered("verifier")
        return verdict

    def _apply_error_budget(self) -> None:
        """Hand `max_wrong_rate` (flag, env or constructor) to a verifier that has an operating point
        to choose, once: the verifier is built from its own settings and cannot see this cache's."""
        budget = self.settings.max_wrong_rate
        if getattr(self, "_budget_applied", None) == budget:
            return
        use = getattr(self.verifier, "use_max_wrong_rate", None)
        if callable(use) and getattr(self.verifier, "max_wrong_rate", None) != budget:
            use(budget)
        self._budget_applied = budget

    async def _embed(self, text: str) -> np.ndarray:
        try:
            vec = await self.embedder.embed(text)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as e:
            raise _EmbedError() from e
        self._recovered("embedder")
        return vec

    # -- store -------------------------------------------------------------------------------------

    async def store(
        self, req: CacheRequest, answer: Payload, vector: np.ndarray | None = None
    ) -> bool:
        """Write the answer for `req`. Returns False (and never raises) when it could not."""
        req = self._scoped(req)
        if self._skip(req):
            return False
        if not self._redis_allowed():
            return False
        with tracing.span("semserve.cache.store", semserve__cache__kind=req.kind) as span:
            stored = await self._store(req, answer, vector)
            span.set_attribute("semserve.cache.stored", stored)
            if not stored:
                tracing.fail(span, "store_failed")
            return stored

    async def _store(self, req: CacheRequest, answer: Payload, vector: np.ndarray | None) -> bool:
        phase = _Phase()
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000.0):
                phase.name = "epoch"
                req = await self._read_epoch(req, self.settings.store_timeout_ms / 1000.0)
                if vector is None:
                    phase.name = "embed"
                    with tracing.span("semserve.cache.embed"):
                        vector = await self._embed(req.prompt)
                phase.name = "put"
                with self._redis_span("EVALSHA"):
                    await self._entries.put(req, req.prompt, vector, answer, self.settings.ttl_seconds)
                await self._redis_up()
        except TimeoutError:
            self.counters.timeouts += 1
            self.counters.store_errors += 1
            if phase.name == "embed":
                self.counters.embed_errors += 1
                self._fail("embedder", "timeout")
            else:
                self._redis_down(f"timeout in store {phase.name}", timeout=True)
            return False
        except _EmbedError as e:
            self.counters.embed_errors += 1
            self.counters.store_errors += 1
            self._fail("embedder", e.__cause__ or e)
            return False
        except (RedisError, OSError) as e:
            self.counters.store_errors += 1
            if isinstance(e, _UNREACHABLE):
                self._redis_down(e)
            else:
                self.counters.redis_errors += 1
                self._fail("redis_command", e)
            return False
        except Exception as e:
            # Not JSON-able answer, wrong vector size, a bug: the request must still succeed.
            self.counters.store_errors += 1
            log.error("cache_store_rejected", error=f"{type(e).__name__}: {e}")
            return False
        self.counters.stores += 1
        return True

    # -- single flight -----------------------------------------------------------------------------

    def flight_key(self, req: CacheRequest) -> str | None:
        """The key under which identical concurrent requests share one generation (None: this
        request shares nothing, e.g. a bypass); the same as `run_once` uses."""
        req = self._scoped(req)
        if self._skip(req):
            return None
        return keys.exact_key(req, self._entries.schema.version)

    async def run_once(
        self,
        req: CacheRequest,
        produce: Callable[[], Awaitable[T]],
        *,
        vector: np.ndarray | None = None,
        should_store: Callable[[T], bool] | None = None,
        store: bool = True,
        replicas: bool = True,
    ) -> T:
        """Call `produce` once for all concurrent identical requests; the leader stores its answer
        (if `store` and `should_store(answer)`) before the flight closes, so requests arriving in
        between still share it. `replicas`: share with other replicas through the lease too (off for
        a request that may not be served from the cache: a peer's answer is a cached one)."""
        req = self._scoped(req)
        if self._skip(req):
            return await produce()
        key = keys.exact_key(req, self._entries.schema.version)
        while True:
            fut = self._flights.get(key)
            if fut is None:
                break
            self.counters.singleflight_joined += 1
            with tracing.span("semserve.cache.singleflight.wait") as span:
                try:
                    answer = await asyncio.wait_for(asyncio.shield(fut), self.settings.singleflight_wait_s)
                    span.set_attribute("semserve.cache.singleflight.outcome", "shared")
                    return answer
                except TimeoutError:
                    self.counters.singleflight_wait_timeouts += 1
                    span.set_attribute("semserve.cache.singleflight.outcome", "timeout")
                except _LeaderCancelled:
                    span.set_attribute("semserve.cache.singleflight.outcome", "leader_cancelled")
                    continue
            # Out of the wait span: the request's own predictor call is not part of the wait.
            return await produce()

        self.counters.singleflight_leaders += 1
        fut = asyncio.get_running_loop().create_future()
        # Nobody may be waiting: do not let asyncio log "exception never retrieved".
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._flights[key] = fut
        claim = Claim("alone")
        try:
            try:
                # Inside the flight's try: a leader cancelled while it claims still resolves the flight.
                if store and replicas:
                    claim = await self.claim_replicas(req)
                shared = await self.peer_answer(req) if claim.role == "answered" else None
                answer = shared if shared is not None else await produce()
            except asyncio.CancelledError:
                fut.set_exception(_LeaderCancelled())
                raise
            except BaseException as e:
                fut.set_exception(e)
                raise
            fut.set_result(answer)  # release the waiters before the store round trip
            if shared is None and store and (should_store is None or should_store(answer)):
                await claim.release(await self.store(req, answer, vector))  # type: ignore[arg-type]
            return answer
        finally:
            await claim.release(False)  # not stored (or already released): one waiter takes over
            if self._flights.get(key) is fut:
                del self._flights[key]

    async def claim_replicas(self, req: CacheRequest) -> Claim:
        """The cross-replica lease of `req` (cache/lease.py): lead, read a peer's stored answer, or
        go alone (off, Redis known down, wait ran out)."""
        req = self._scoped(req)
        if self.replica_flights is None or self.counters.degraded or self._skip(req):
            return Claim("alone")
        key = keys.exact_key(req, self._entries.schema.version)
        with tracing.span("semserve.cache.singleflight.lease") as span:
            claim = await self.replica_flights.claim(key, self.settings.singleflight_wait_s)
            span.set_attribute("semserve.cache.singleflight.role", claim.role)
        if claim.role == "answered":
            self.counters.singleflight_joined += 1
        return claim

    async def peer_answer(self, req: CacheRequest) -> Payload | None:
        """The answer another replica stored for `req` (None: gone, or Redis failed: produce). The
        store's budget, not the lookup's: after a wait, a slow read still beats a generation."""
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000.0):
                hit = await self._entries.get_exact(self._scoped(req))
        except (RedisError, *_UNREACHABLE):
            return None
        return hit.answer if hit is not None else None


def _redis_attributes(store: RedisCacheStore) -> dict[str, Any]:
    """DB semantic-convention attributes of the store's Redis (test doubles may have none)."""
    pool = getattr(getattr(store, "client", None), "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    attrs: dict[str, Any] = {"db__system__name": "redis", "db__system": "redis"}
    if isinstance(kwargs, dict):
        if kwargs.get("host"):
            attrs["server__address"] = str(kwargs["host"])
        if kwargs.get("port"):
            attrs["server__port"] = int(kwargs["port"])
        if kwargs.get("db") is not None:
            attrs["db__namespace"] = str(kwargs["db"])
    return attrs


class _EmbedError(Exception):
    """The embedder raised; its exception is __cause__."""
