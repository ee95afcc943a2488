"""Single flight: concurrent identical misses in this process (same exact key) call `produce` once;
the others wait up to `singleflight_wait_s` for its answer. Decisions:
- if the leader's `produce` raises, the waiters get the same exception: it is the same request, so
  the same failure is the likely outcome, and N retries would hit a predictor that is already
  failing. The client may retry.
- if the leader is cancelled (its client went away), the waiters are not: they form a new flight,
  one of them becomes the leader.
- a waiter whose wait runs out calls its own `produce` (bounded wait, never a hang).
Across replicas (cache/lease.py, `singleflight_replicas`): this process's leader of a key first
takes a lease in Redis (`claim`); when another replica holds it, it waits for that replica's stored
answer (`peer_answer`) and serves it. Only flights whose answer would be stored take part.

Tracing: `semserve.cache.singleflight.wait` for a request that joins a flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cache.counters import CacheCounters
from cache.lease import Claim
from cache.settings import CacheSettings
from semserve import tracing

T = TypeVar("T")


class _LeaderCancelled(Exception):
    pass


class SingleFlight:
    """The flights of one cache in this process, by exact key."""

    def __init__(self, counters: CacheCounters, settings: CacheSettings) -> None:
        self.counters = counters
        self.settings = settings  # read at each wait: `singleflight_wait_s` may change at run time
        self.flights: dict[str, asyncio.Future[Any]] = {}

    async def run(
        self,
        key: str,
        produce: Callable[[], Awaitable[T]],
        *,
        claim: Callable[[], Awaitable[Claim]] | None,
        peer_answer: Callable[[], Awaitable[Any]],
        store: Callable[[T], Awaitable[bool]] | None,
        should_store: Callable[[T], bool] | None = None,
    ) -> T:
        """Call `produce` once for all concurrent callers of `key`. The leader takes the replicas'
        lease (`claim`, None: no replicas) and stores its answer (`store`, None: no store; only if
        `should_store(answer)`) before the flight closes, so requests arriving in between still
        share it."""
        while True:
            fut = self.flights.get(key)
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
        self.flights[key] = fut
        lease = Claim("alone")
        try:
            try:
                # Inside the flight's try: a leader cancelled while it claims still resolves the flight.
                if claim is not None:
                    lease = await claim()
                shared = await peer_answer() if lease.role == "answered" else None
                answer = shared if shared is not None else await produce()
            except asyncio.CancelledError:
                fut.set_exception(_LeaderCancelled())
                raise
            except BaseException as e:
                fut.set_exception(e)
                raise
            fut.set_result(answer)  # release the waiters before the store round trip
            if shared is None and store is not None and (should_store is None or should_store(answer)):
                await lease.release(await store(answer))
            return answer
        finally:
            await lease.release(False)  # not stored (or already released): one waiter takes over
            if self.flights.get(key) is fut:
                del self.flights[key]
