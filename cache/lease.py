"""Single flight across replicas: the first replica to miss on a key generates, the others wait.

Per process, identical concurrent misses already share one generation (cache/single_flight.py,
driven by transformers_svc/answer_pipeline.py). This adds one step for the process's leader of a
key: a lease in Redis, so that N replicas behind a load balancer make one predictor call for a burst, not N.

- The lease is `SET <lease key> <token> NX PX lease_ms`, renewed by the leader while it generates
  (a replica that dies stops renewing; the lease expires after at most `lease_ms`).
- The leader ends with a compare-and-set script: after its answer is stored, the lease's value
  becomes "done" for a short while (a replica that looked up just before the store and claims just
  after reads the answer rather than generating again), and a message "done" goes to the key's
  channel. A leader that fails (predictor error, answer not storable, store failed) deletes the
  lease and publishes "gone": one waiter takes it over.
- Waiters subscribe to the key's channel (pub/sub: notified, not polling), then read the lease once
  per `lease_ms` while they wait, which is how they notice a leader that died without a word.
  Nobody waits past `wait_s`: then the waiter produces on its own (bounded wait, never a hang).
- Redis down or slow: the claim says "alone" and the replica produces on its own, like per-process
  single flight did before (fail open).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from semserve.logs import get_logger

log = get_logger("cache.lease")

DONE = b"done"
GONE = b"gone"
# How long "done" stays on a finished lease: covers requests that looked up just before the store.
DONE_LINGER_MS = 5000

# KEYS[1] lease; ARGV: token, lease_ms. Extend only our own lease.
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease, KEYS[2] channel; ARGV: token, outcome (done|gone), linger_ms. Only the holder
# ends its lease; a lease that expired and was taken by another replica is left alone.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'done' then
  redis.call('SET', KEYS[1], 'done', 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 1
"""

Role = Literal["leader", "answered", "alone"]


@dataclass
class LeaseCounters:
    """What the transformer exports about cross-replica flights."""

    leaders: int = 0  # claims that took the lease
    answered: int = 0  # waits ended by another replica's stored answer
    takeovers: int = 0  # leases taken after the previous holder gave up or died
    wait_timeouts: int = 0  # waits that ran out of `wait_s`
    unavailable: int = 0  # Redis errors: the replica went on alone


@dataclass
class Claim:
    """The outcome of `ReplicaFlights.claim`: lead (holding the lease), read the answer a peer
    stored, or produce alone (no lease: Redis down, wait ran out)."""

    role: Role
    waited_s: float = 0.0
    _release: Callable[[bool], Awaitable[None]] | None = field(default=None, repr=False)  # leaders only

    async def release(self, answered: bool) -> None:
        """End the lease: `answered` when the answer is stored for the others to read. Never
        raises; a no-op for a claim that holds no lease."""
        release, self._release = self._release, None
        if release is not None:
            await release(answered)


class ReplicaFlights:
    """Leases and notifications for keys of one deployment, on the cache's Redis."""

    def __init__(
        self,
        client: Redis,
        namespace: str,
        *,
        lease_ms: int = 3000,
        op_timeout_s: float = 0.5,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.lease_ms = lease_ms
        self.op_timeout_s = op_timeout_s
        self.counters = LeaseCounters()
        self._renew = client.register_script(_RENEW_LUA)
        self._release_script = client.register_script(_RELEASE_LUA)

    def lease_key(self, key: str) -> str:
        return f"{self.namespace}:lease:{key}"

    def channel(self, key: str) -> str:
        return f"{self.namespace}:flight:{key}"

    async def claim(self, key: str, wait_s: float) -> Claim:
        """Take the lease of `key`, or wait (at most `wait_s`) for its holder's answer."""
        started = time.monotonic()
        try:
            return await self._claim(key, started, wait_s)
        except (RedisError, OSError, TimeoutError) as e:
            self.counters.unavailable += 1
            log.debug("lease_unavailable", error=f"{type(e).__name__}: {e}")
            return Claim("alone", time.monotonic() - started)

    async def _claim(self, key: str, started: float, wait_s: float) -> Claim:
        token = secrets.token_hex(8)
        lease, chan = self.lease_key(key), self.channel(key)
        taken_over = False
        while True:
            async with asyncio.timeout(self.op_timeout_s):
                got = await self.client.set(lease, token, nx=True, px=self.lease_ms)
            if got:
                self.counters.leaders += 1
                self.counters.takeovers += taken_over
                hold = self._hold(lease, chan, token, hold_s=wait_s)
                return Claim("leader", time.monotonic() - started, hold)
            remaining = wait_s - (time.monotonic() - started)
            if remaining <= 0:
                self.counters.wait_timeouts += 1
                return Claim("alone", time.monotonic() - started)
            outcome = await self._wait(lease, chan, remaining)
            if outcome == DONE:
                self.counters.answered += 1
                return Claim("answered", time.monotonic() - started)
            if outcome is None:  # wait_s ran out
                self.counters.wait_timeouts += 1
                return Claim("alone", time.monotonic() - started)
            taken_over = True  # the holder gave up or died: try to take the lease ourselves

    async def _wait(self, lease: str, chan: str, budget_s: float) -> bytes | None:
        """DONE, GONE (the lease is free: try to take it) or None (the budget ran out)."""
        deadline = time.monotonic() + budget_s
        pubsub = self.client.pubsub()
        try:
            async with asyncio.timeout(self.op_timeout_s):
                await pubsub.subscribe(chan)
            # Subscribed first, read second: an end between the two is seen in the value.
            while True:
                async with asyncio.timeout(self.op_timeout_s):
                    value = await self.client.get(lease)
                if value is None:
                    return GONE
                if value == DONE:
                    return DONE
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                # A message ends the wait at once; the lease is read again every lease_ms in case
                # its holder died without one.
                message = await _next_message(pubsub, min(left, self.lease_ms / 1000.0))
                if message is not None:
                    return DONE if message == DONE else GONE
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    def _hold(
        self, lease: str, chan: str, token: str, hold_s: float
    ) -> Callable[[bool], Awaitable[None]]:
        """Renew the lease while the leader generates; the returned coroutine function ends it.
        Renewal stops after `hold_s` (the waiters' budget: nobody waits longer), so a lease its
        holder forgot to release expires on its own."""

        async def renew() -> None:
            until = time.monotonic() + hold_s
            while time.monotonic() < until:
                await asyncio.sleep(self.lease_ms / 3000.0)
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    async with asyncio.timeout(self.op_timeout_s):
                        if not await self._renew(keys=[lease], args=[token, self.lease_ms]):
                            return  # lost (expired and taken): nothing left to renew

        task = asyncio.ensure_future(renew())

        async def release(answered: bool) -> None:
            task.cancel()
            outcome = "done" if answered else "gone"
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    await self._release_script(
                        keys=[lease, chan], args=[token, outcome, DONE_LINGER_MS]
                    )
            except (RedisError, OSError, TimeoutError) as e:
                # The waiters see the lease expire (at most lease_ms) and go on.
                log.debug("lease_release_failed", error=f"{type(e).__name__}: {e}")

        return release


async def _next_message(pubsub: Any, timeout_s: float) -> bytes | None:
    """The next published payload on the subscription, or None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if msg is not None and msg.get("type") == "message":
            data = msg.get("data")
            return data if isinstance(data, bytes) else str(data).encode()
    return None
