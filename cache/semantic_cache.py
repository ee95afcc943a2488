"""The cache policy: when to read, what to serve, when to write, and what to do when Redis fails.

Kept apart from the layout (cache.schema, cache.entry_store) and from the models (cache.interfaces), so
each can change alone.

Lookup: exact key first (one Redis read, no embedding); then embed, KNN over entries with the same
tenant + model + fingerprint, and the verifier on candidates best-first; the first accepted one is
served. Candidates under `min_similarity` are not even verified. With a judge (optional, off by
default): when no candidate is accepted, the best one the scorer rejected by score alone with a
probability of at least `judge_min_score` is asked of the judge, once per lookup, and served if the
judge's same-answer probability reaches `judge_threshold`; a failing or slow judge rejects.

Fail open: the KNN of a lookup runs under `lookup_timeout_ms`, the embedding under
`embed_timeout_ms`, the exact read and every store under `store_timeout_ms`.
A Redis error or timeout makes the lookup return status "error" (the caller goes
to the predictor); cache/health.py decides when Redis is out of the path and when it is probed again.

Single flight is the transformer's (transformers_svc/answer_pipeline.py, over cache/single_flight.py);
the cache gives it the flight key, the replicas' lease (cache/lease.py) and a peer's stored answer.

Tracing (OpenTelemetry API only, through semserve.tracing; no-ops unless the request is traced):
`semserve.cache.lookup` with children HMGET (exact), `semserve.cache.embed`, FT.SEARCH (KNN) and
`semserve.cache.verify` (the decision; `semserve.cache.judge` in it when a judge is asked);
`semserve.cache.store` with
its EVALSHA. Redis spans follow the DB semantic conventions.
No prompt text on any span unless the transformer runs with --record-prompt-text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from redis.exceptions import RedisError, ResponseError

from cache import keys
from cache.counters import CacheCounters
from cache.entry_store import Candidate, EntryStore, is_missing_index
from cache.epoch import SharedEpoch
from cache.health import UNREACHABLE, RedisHealth
from cache.interfaces import Embedder, Judge, Verdict, Verifier
from cache.judge_step import JudgeStep
from cache.keys import CacheRequest
from cache.lease import Claim, ReplicaFlights
from cache.lookup_result import LookupResult
from cache.payload import Payload
from cache.redis_spans import RedisSpans
from cache.settings import CacheSettings
from semserve import tracing
from semserve.logs import get_logger

log = get_logger("cache.semantic_cache")


class _Phase:
    """Which step a lookup is in, so a deadline hit can be blamed on Redis or on the embedder."""

    def __init__(self) -> None:
        self.name = "start"


class SemanticCache:
    def __init__(
        self,
        entries: EntryStore,
        embedder: Embedder,
        verifier: Verifier,
        settings: CacheSettings,
        judge: Judge | None = None,
    ) -> None:
        dim = getattr(embedder, "dim", None)
        if dim is not None and int(dim) != entries.schema.dim:
            raise ValueError(f"embedder dim {dim} != index dim {entries.schema.dim}")
        self._entries = entries
        self.embedder = embedder
        self.verifier = verifier
        self.settings = settings
        self.counters = CacheCounters()
        self._failing: dict[str, str] = {}  # component -> last error, for one log line per change
        # None: the scorer's verdicts are final (the default).
        self.judge_step = (
            JudgeStep(judge, settings, self.counters,
                      lambda c, e: self._fail(c, e, per_message=True), self._recovered)
            if judge is not None else None
        )  # fmt: skip
        self.health = RedisHealth(self.counters, settings, self._fail, self._recovered)
        self._redis_span = RedisSpans(entries)
        client = getattr(entries, "client", None)  # test doubles may have no Redis
        self.replica_flights = (
            ReplicaFlights(client, entries.schema.index_name, lease_ms=settings.singleflight_lease_ms,
                           op_timeout_s=settings.store_timeout_ms / 1000.0)
            if settings.singleflight_replicas and client is not None else None
        )  # fmt: skip
        # The epoch shared by the replicas (cache/epoch.py); without Redis, the setting alone.
        self.epochs = (
            SharedEpoch(client, entries.schema.index_name, floor=settings.epoch,
                        refresh_s=settings.epoch_refresh_s, op_timeout_s=settings.store_timeout_ms / 1000.0)
            if client is not None else None
        )  # fmt: skip

    @property
    def entries(self) -> EntryStore:
        """The entry store (Redis) of this cache, for what works on entries rather than on one
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

    async def _redis_up(self) -> None:
        if self.health.up():
            await self.ensure_index()  # Redis may be a fresh, empty instance now.

    async def ensure_index(self) -> bool:
        """Create the index if missing. Never raises for Redis failures (returns False)."""
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000.0):
                created = await self._entries.ensure_index()
        except (RedisError, *UNREACHABLE) as e:
            self.health.down(e)
            return False
        if created:
            self.counters.index_created += 1
        return created

    async def start(self) -> None:
        """Best effort at startup: the service starts even if Redis is not there yet."""
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
        return req.bypass or not keys.normalize_text(req.prompt)

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

    async def lookup(
        self, req: CacheRequest, on_exact_miss: Callable[[], None] | None = None
    ) -> LookupResult:
        """The answer to serve for `req`, if any. `on_exact_miss` is called once the exact read has
        missed, before the embedding: the caller may start work that only a miss needs (the
        pipeline's speculative predictor stream) while the semantic part runs."""
        req = self._scoped(req)
        with tracing.span("semserve.cache.lookup", semserve__cache__kind=req.kind) as span:
            res = await self._traced_lookup(req, on_exact_miss)
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

    async def _traced_lookup(
        self, req: CacheRequest, on_exact_miss: Callable[[], None] | None
    ) -> LookupResult:
        t0 = time.perf_counter()
        if self._skip(req):
            return self._finish(LookupResult("bypass"), t0)
        if not self.health.allowed():
            return self._finish(LookupResult("error", error="degraded"), t0)
        res = LookupResult("miss")
        phase = _Phase()
        try:
            await self._lookup(req, res, phase, on_exact_miss)
        except TimeoutError:
            self.counters.timeouts += 1
            res = LookupResult("error", timings=res.timings, error=f"timeout in {phase.name}")
            if phase.name == "embed":
                self.counters.embed_errors += 1
                self._fail("embedder", res.error)
            else:
                self.health.down(res.error, timeout=True)
        except (RedisError, OSError) as e:
            res = LookupResult("error", timings=res.timings, error=f"{type(e).__name__} in {phase.name}")
            self.health.failed(e)
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

    async def _lookup(
        self, req: CacheRequest, res: LookupResult, phase: _Phase, on_exact_miss: Callable[[], None] | None
    ) -> None:
        t = time.perf_counter()
        phase.name = "exact"
        # The KNN gets the tight budget (a slow Redis must cost only milliseconds); the embedding
        # gets its own, since CPU contention, not Redis, decides how long it takes. The exact read
        # (and the epoch read before a model's first one) gets the store's: it is one cheap round
        # trip that can find a whole answer, and a CPU-starved process (a fresh replica on a busy
        # node) must not turn an answer another replica just stored into a miss and a generation.
        # A Redis that is really slow is taken out of the path after `degrade_after_timeouts`.
        redis_budget = self.settings.lookup_timeout_ms / 1000.0
        exact_budget = max(redis_budget, self.settings.store_timeout_ms / 1000.0)
        phase.name = "epoch"
        req = await self._read_epoch(req, exact_budget)
        # With embed_during_exact the forward runs while the exact read is on the wire; an exact hit
        # cancels it (skipped if not started yet; one already running finishes into the LRU).
        early = None
        if self.settings.embed_during_exact:
            early = asyncio.ensure_future(self._traced_embed(req.prompt))
        try:
            phase.name = "exact"
            with self._redis_span("HMGET") as span:
                async with asyncio.timeout(exact_budget):
                    hit = await self._entries.get_exact(req)
                span.set_attribute("semserve.cache.exact_hit", hit is not None)
            res.timings["exact"] = (time.perf_counter() - t) * 1000.0
            await self._redis_up()
            if hit is not None:
                res.status, res.answer, res.similarity = "exact", hit.answer, 1.0
                res.entry_id, res.cached_prompt = hit.entry_id, hit.prompt
                return
            if on_exact_miss is not None:
                on_exact_miss()

            t = time.perf_counter()
            phase.name = "embed"
            async with asyncio.timeout(self.settings.embed_timeout_ms / 1000.0):
                res.vector = await (early if early is not None else self._traced_embed(req.prompt))
            res.timings["embed"] = (time.perf_counter() - t) * 1000.0
        finally:
            if early is not None:  # an exact hit or a Redis error: nobody awaits it any more
                early.cancel()
                early.add_done_callback(_consume)

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
            grey: tuple[Candidate, Verdict] | None = None  # the best candidate worth asking the judge
            for c in candidates:  # best first
                verdict = self._verify(req.prompt, c.prompt, c.similarity)
                if verdict.accept:
                    self._serve(res, c, verdict)
                    break
                self.counters.verifier_rejections += 1
                if res.verdict is None:
                    res.similarity, res.verdict = c.similarity, verdict
                if (self.judge_step is not None and self.judge_step.wants(verdict)
                        and (grey is None or verdict.score > grey[1].score)):
                    grey = (c, verdict)  # the likeliest one: at most one judge call per lookup
            if self.judge_step is not None and grey is not None and res.status != "semantic":
                # Only after the loop: an accepted candidate never costs a judge call.
                tj = time.perf_counter()
                c, verdict = grey
                judged = await self.judge_step.ask(req.prompt, c.prompt, verdict)
                res.timings["judge"] = (time.perf_counter() - tj) * 1000.0
                if judged.accept:
                    self._serve(res, c, judged)
                else:
                    res.similarity, res.verdict = c.similarity, judged
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

    @staticmethod
    def _serve(res: LookupResult, c: Candidate, verdict: Verdict) -> None:
        res.status, res.answer, res.verdict = "semantic", c.answer, verdict
        res.similarity, res.entry_id, res.cached_prompt = c.similarity, c.entry_id, c.prompt

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

    async def _traced_embed(self, text: str) -> np.ndarray:
        with tracing.span("semserve.cache.embed"):
            return await self._embed(text)

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
        if not self.health.allowed_to_store():
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
                self.health.down(f"timeout in store {phase.name}", timeout=True)
            return False
        except _EmbedError as e:
            self.counters.embed_errors += 1
            self.counters.store_errors += 1
            self._fail("embedder", e.__cause__ or e)
            return False
        except (RedisError, OSError) as e:
            self.counters.store_errors += 1
            self.health.failed(e)
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
        request shares nothing, e.g. a bypass): the exact key (transformers_svc/answer_pipeline.py)."""
        req = self._scoped(req)
        if self._skip(req):
            return None
        return keys.exact_key(req, self._entries.schema.version)

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
        except (RedisError, *UNREACHABLE):
            return None
        return hit.answer if hit is not None else None


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class _EmbedError(Exception):
    """The embedder raised; its exception is __cause__."""
