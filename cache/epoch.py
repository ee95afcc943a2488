"""The cache epoch shared by every replica on one Redis, per model.

The epoch is part of every key (cache.keys): a bump makes all older entries unreadable at once. A
per-process setting (`--cache-epoch`, set by `semserve tenant promote|rollback`) is not enough when
replicas must agree, so the epoch also lives in Redis, one hash field per model under the index's
name (so per deployment and schema version):

- Redis holds two numbers per model: the highest setting any replica started with, and the number
  of admin bumps; the shared epoch is their sum. So a replica that starts with a higher setting
  (`promote` restarts the transformer with the annotated epoch) raises it for all (atomic max, Lua),
  and a `promote` after admin bumps still moves the epoch (with max(setting, shared value) alone, a
  promote to 2 after bumps to 3 would change nothing and serve the old model's answers);
- effective epoch of a model = max(the setting, the shared epoch, the highest this process saw):
  it only ever goes up, so an entry of an older epoch is never served again; a replica that knows
  a higher value than Redis (restarted empty) raises the bump count back;
- a bump (`POST /admin/cache/epoch`) is one atomic Lua call: bumps + 1, then PUBLISH on the epoch
  channel, so the other replicas learn it within a round trip;
- requests never wait on Redis for it: the value is kept in process, updated by those messages and
  by a periodic re-read every `refresh_s` that bounds how long a missed message counts;
- Redis down: the last known value stays (fail open, like the rest of the cache).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from semserve.logs import get_logger

log = get_logger("cache.epoch")

# One model's shared epoch: fields s:<model> (highest setting seen) and b:<model> (bumps). Raised to
# this replica's setting and to the epoch it already uses (known), then returned as s + b.
_SHARED = """
local function shared(hash, model, setting, known)
  local sf, bf = 's:' .. model, 'b:' .. model
  local s = tonumber(redis.call('HGET', hash, sf)) or 0
  local b = tonumber(redis.call('HGET', hash, bf)) or 0
  if setting > s then
    s = setting
    redis.call('HSET', hash, sf, s)
  end
  if s + b < known then
    b = known - s
    redis.call('HSET', hash, bf, b)
  end
  return s, b
end
"""

# KEYS[1] the epoch hash; ARGV: model, setting, known, model, setting, known, ... Returns each
# model's shared epoch in order.
_RAISE_LUA = _SHARED + """
local out = {}
for i = 1, #ARGV, 3 do
  local s, b = shared(KEYS[1], ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  out[#out + 1] = s + b
end
return out
"""

# KEYS[1] the epoch hash, KEYS[2] the channel; ARGV: model, setting, known. One more bump, then
# tell the other replicas "<epoch> <model>" (the epoch first: a model name may hold spaces).
_BUMP_LUA = _SHARED + """
local s, b = shared(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
b = b + 1
redis.call('HSET', KEYS[1], 'b:' .. ARGV[1], b)
redis.call('PUBLISH', KEYS[2], tostring(s + b) .. ' ' .. ARGV[1])
return s + b
"""

_FAILURES = (RedisError, OSError, TimeoutError)


@dataclass
class EpochCounters:
    """What the shared epoch did; the admin stats show them."""

    bumps: int = 0  # bumps made through this process
    notified: int = 0  # bump messages received
    refreshes: int = 0  # successful re-reads of the known models
    errors: int = 0  # Redis calls that failed or timed out (the last known epochs stayed)


class SharedEpoch:
    """Per-model cache epochs of one index, kept in process and shared through Redis."""

    def __init__(
        self,
        client: Redis,
        namespace: str,
        *,
        floor: int = 0,
        refresh_s: float = 1.0,
        op_timeout_s: float = 0.5,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.floor = floor  # the setting: never go below it
        self.refresh_s = refresh_s
        self.op_timeout_s = op_timeout_s
        self.counters = EpochCounters()
        self._known: dict[str, int] = {}  # models synced with Redis at least once
        self._first_sync: dict[str, asyncio.Future[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Set by close. Cancelling alone is not enough: on Python 3.11 a cancel that lands as a read's
        # own timeout expires comes out as TimeoutError, which the loops take for a Redis failure
        # and go on (seen as a close that never returned).
        self._closing = False
        self._raise = client.register_script(_RAISE_LUA)
        self._bump = client.register_script(_BUMP_LUA)

    @property
    def key(self) -> str:
        return f"{self.namespace}:epoch"

    @property
    def channel(self) -> str:
        return f"{self.namespace}:epoch:bumped"

    def current(self, model: str) -> int:
        """The effective epoch of `model`, without a round trip."""
        return max(self.floor, self._known.get(model, 0))

    def knows(self, model: str) -> bool:
        return model in self._known

    def known(self) -> dict[str, int]:
        """Effective epoch of every model this process has synced."""
        return {model: self.current(model) for model in sorted(self._known)}

    def _see(self, model: str, epoch: int) -> None:
        if epoch > self._known.get(model, -1):
            if model in self._known:
                log.info("cache_epoch_changed", model=model, epoch=max(self.floor, epoch))
            self._known[model] = epoch

    # -- Redis ---------------------------------------------------------------------------------

    async def sync(self, models: list[str]) -> None:
        """Raise Redis to this process's setting and to what it knows, read the result back.
        Raises on Redis failure."""
        args: list[bytes | int] = []
        for model in models:
            args += [_field(model), self.floor, self.current(model)]
        async with asyncio.timeout(self.op_timeout_s):
            values = await self._raise(keys=[self.key], args=args)
        for model, value in zip(models, values, strict=True):
            self._see(model, int(value))

    async def ensure(self, model: str, timeout_s: float) -> None:
        """Sync `model` once, the first time this process sees it; concurrent first requests wait
        for the same round trip (at most `timeout_s`). Raises on Redis failure or timeout: the
        model stays unknown and the next request tries again."""
        if model in self._known:
            return
        fut = self._first_sync.get(model)
        if fut is None:
            fut = asyncio.ensure_future(self.sync([model]))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved below
            self._first_sync[model] = fut
            fut.add_done_callback(lambda _: self._first_sync.pop(model, None))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except Exception:
            self.counters.errors += 1
            raise

    async def bump(self, model: str) -> int:
        """Make a new epoch for `model` on every replica; returns it. Raises on Redis failure."""
        async with asyncio.timeout(self.op_timeout_s):
            args = [_field(model), self.floor, self.current(model)]
            new = int(await self._bump(keys=[self.key, self.channel], args=args))
        self.counters.bumps += 1
        if model in self._known:  # a model this process never served is synced on first use
            self._see(model, new)
        return new

    # -- background: notifications and the periodic re-read -------------------------------------

    def start(self) -> None:
        """Start listening for bumps and re-reading every `refresh_s` (in the running loop)."""
        if not self._tasks:
            self._closing = False
            self._tasks = [asyncio.ensure_future(self._listen()), asyncio.ensure_future(self._refresh())]

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        self._closing = True
        for task in tasks:
            task.cancel()
        # Their CancelledError is returned, not raised; a cancel of close itself still propagates.
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.refresh_s)
            if not self._known:
                continue
            try:
                await self.sync(list(self._known))
                self.counters.refreshes += 1
            except _FAILURES as e:
                self.counters.errors += 1
                log.debug("cache_epoch_refresh_failed", error=f"{type(e).__name__}: {e}")

    async def _listen(self) -> None:
        """Apply bump messages as they come; resubscribe after a failure (the re-read covers what
        was missed meanwhile)."""
        while not self._closing:
            pubsub = self.client.pubsub()
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    await pubsub.subscribe(self.channel)
                while not self._closing:
                    # An explicit read timeout: the client's socket timeout is the store's budget.
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        self._on_message(msg.get("data"))
            except _FAILURES as e:
                self.counters.errors += 1
                log.debug("cache_epoch_listen_failed", error=f"{type(e).__name__}: {e}")
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(self.refresh_s)

    def _on_message(self, data: object) -> None:
        text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else str(data)
        epoch, _, model = text.partition(" ")
        try:
            value = int(epoch)
        except ValueError:
            return  # not ours
        self.counters.notified += 1
        if model in self._known:  # a model this process never served is synced on first use
            self._see(model, value)


def _field(model: str) -> bytes:
    """The model's hash field: any str, a lone surrogate from JSON included, must encode."""
    return model.encode("utf-8", "surrogatepass")
