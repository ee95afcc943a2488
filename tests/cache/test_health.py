"""RedisHealth: when Redis leaves the request path and when it is probed again (no Redis needed)."""

from __future__ import annotations

import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from cache.counters import CacheCounters
from cache.health import RedisHealth
from cache.settings import CacheSettings


def make_health(**kw: object) -> tuple[RedisHealth, CacheCounters, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    counters = CacheCounters()
    health = RedisHealth(
        counters,
        CacheSettings(**kw),  # type: ignore[arg-type]
        fail=lambda component, exc: events.append(("fail", component)),
        recovered=lambda component: events.append(("recovered", component)),
    )
    return health, counters, events


def test_unreachable_degrades_at_once_and_probes_once_per_interval() -> None:
    health, counters, events = make_health(degraded_retry_s=0.05)
    health.failed(RedisConnectionError("refused"))
    assert counters.degraded and counters.redis_errors == 1 and events == [("fail", "redis")]
    assert not health.allowed() and counters.skipped_degraded == 1
    time.sleep(0.06)
    assert health.allowed()  # the probe
    assert not health.allowed()  # and only one per interval
    assert health.up() and not counters.degraded
    assert events[-1] == ("recovered", "redis")
    assert not health.up()  # already up: nothing to recreate


def test_command_errors_do_not_degrade() -> None:
    health, counters, events = make_health()
    health.failed(ResponseError("OOM command not allowed"))
    assert not counters.degraded and counters.redis_errors == 1
    assert events == [("fail", "redis_command")] and health.allowed()


def test_only_consecutive_timeouts_degrade() -> None:
    health, counters, _ = make_health(degrade_after_timeouts=2)
    health.down("timeout", timeout=True)
    assert not counters.degraded
    health.up()  # a success in between resets the run
    health.down("timeout", timeout=True)
    assert not counters.degraded
    health.down("timeout", timeout=True)
    assert counters.degraded and counters.redis_errors == 3


def test_a_store_is_tried_while_only_slowness_degraded_redis() -> None:
    """Read-your-writes: timeouts (often this process starved of CPU) keep lookups out of Redis,
    but a complete answer's store is still tried; a Redis that refused us is skipped until the
    probe."""
    health, counters, _ = make_health(degrade_after_timeouts=1, degraded_retry_s=60)
    health.down("timeout", timeout=True)
    assert counters.degraded and not health.allowed()
    assert health.allowed_to_store()
    health.failed(RedisConnectionError("refused"))
    assert not health.allowed_to_store()
