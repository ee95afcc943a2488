"""Fail open on Redis: when to take Redis out of a request's path, and when to try it again.

A Redis error or timeout bumps a counter and marks the cache degraded with ONE log line. While
degraded, requests skip Redis entirely and one probe is let through every `degraded_retry_s`; the
first success logs the recovery (the policy then recreates the index if Redis came back empty).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cache.counters import CacheCounters
from cache.settings import CacheSettings

# Redis unreachable or not serving: these trip the degraded state. Other ResponseErrors (e.g. OOM
# on a write) mean Redis answers; they are counted and logged but do not stop lookups.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError, TimeoutError)


class RedisHealth:
    """The degraded state of one cache's Redis. `fail(component, error)` and
    `recovered(component)` are the cache's one-line-per-change log of its components."""

    def __init__(
        self,
        counters: CacheCounters,
        settings: CacheSettings,
        fail: Callable[[str, BaseException | str], None],
        recovered: Callable[[str], None],
    ) -> None:
        self.counters = counters
        self.settings = settings
        self._fail = fail
        self._recovered = recovered
        self._probe_at = 0.0
        self._timeouts_in_a_row = 0
        self._refused = False  # the last failure was Redis refusing or dropping us, not slowness

    def down(self, exc: BaseException | str, timeout: bool = False) -> None:
        self.counters.redis_errors += 1
        if timeout:
            # One slow round trip may be this process starved of CPU, not Redis: only consecutive
            # timeouts take Redis out of the path. Refused connections do at once.
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row < self.settings.degrade_after_timeouts:
                return
        self._refused = not timeout
        self.counters.degraded = True
        self._probe_at = time.monotonic() + self.settings.degraded_retry_s
        self._fail("redis", exc)

    def failed(self, exc: BaseException) -> None:
        """A Redis call raised: unreachable takes Redis out of the path, a command error does not."""
        if isinstance(exc, UNREACHABLE):
            self.down(exc)
        else:
            self.counters.redis_errors += 1
            self._fail("redis_command", exc)

    def allowed(self) -> bool:
        if not self.counters.degraded:
            return True
        now = time.monotonic()
        if now >= self._probe_at:
            self._probe_at = now + self.settings.degraded_retry_s  # one probe per interval
            return True
        self.counters.skipped_degraded += 1
        return False

    def allowed_to_store(self) -> bool:
        """A complete answer's store is tried unless Redis refused us: slow round trips (timeouts,
        often this process starved of CPU) must not lose an answer a client is about to read back
        through another replica; the store has its own budget."""
        return not self.counters.degraded or not self._refused or self.allowed()

    def up(self) -> bool:
        """A Redis call succeeded. True when Redis was degraded until now: it may be a fresh, empty
        instance, so the caller recreates the index."""
        self._timeouts_in_a_row = 0
        if not self.counters.degraded:
            return False
        self.counters.degraded = False
        self._recovered("redis")
        return True
