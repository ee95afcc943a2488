"""Per-tenant limit counters in the cache's Redis, shared by every replica: one Lua script per
check, so N replicas admit one tenant's limit as one process would.

Requests and tokens per minute are token buckets that refill continuously (limit/60 per second up
to the limit), the way OpenAI's limits replenish; `reset` is the time until a bucket is full again,
what OpenAI's x-ratelimit-reset-* headers say. The clock is Redis's (TIME), one for all replicas.

- requests: one taken per client call (hits included) at the protocol edge (`check_request`).
- tokens: a miss reserves its estimate on admission (`reserve`) and settles to its real usage when
  its generation ends (`settle`: the difference is given back or taken). A reservation is admitted
  while the bucket holds it (or is full, for one bigger than the whole limit), so a limit is crossed
  by at most one reservation's error.
- in flight (max_concurrent): a sorted set of tickets scored by expiry; a replica renews its open
  tickets (`renew`), so the tickets of a replica that died expire on their own.

Keys live under `semserve:limits:{<deployment>:<tenant sha256>}:`, a prefix no cache entry, lease
or index uses (cache/schema.py puts those under `semserve:v<schema>:<deployment>...`); the braces
keep one tenant's keys in one cluster slot, as a script that touches two of them needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from cache.keys import tenant_tag

KEY_PREFIX = "semserve:limits:"
NO_LIMIT = -1  # a limit the tenant does not have, as the scripts read it

_COMMON_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A bucket's level now (full when it has no state: it expired once full).
local function level_of(key, limit)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  if level == nil or ts == nil then return limit end
  level = level + (now - ts) * limit / 60000.0
  if level > limit then level = limit end
  return level
end
-- ms until the bucket holds `want` (0 when it does)
local function ms_until(level, want, limit)
  if level >= want then return 0 end
  if limit <= 0 then return 60000 end
  return math.ceil((want - level) * 60000.0 / limit)
end
local function save(key, level, limit)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  -- No state needed once full again: a missing bucket is a full one.
  redis.call('PEXPIRE', key, ms_until(level, limit, limit) + 1000)
end
"""

# KEYS: requests bucket, tokens bucket. ARGV: rpm, tpm (-1: none).
# -> {admitted, requests remaining, requests reset ms, retry ms, tokens remaining, tokens reset ms}
_REQUEST_LUA = _COMMON_LUA + """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {1, 0, 0, 0, 0, 0}
if rpm >= 0 then
  local level = level_of(KEYS[1], rpm)
  if rpm > 0 and level >= 1 then
    level = level - 1
    save(KEYS[1], level, rpm)
  else
    out[1] = 0
    out[4] = ms_until(level, 1, rpm)
  end
  out[2] = math.max(0, math.floor(level))
  out[3] = ms_until(level, rpm, rpm)
end
if tpm >= 0 then
  local level = level_of(KEYS[2], tpm)
  out[5] = math.max(0, math.floor(level))
  out[6] = ms_until(level, tpm, tpm)
end
return out
"""

# KEYS: tokens bucket, in-flight set. ARGV: tpm, cost, max_concurrent, ticket, ticket ttl ms.
# -> {admitted, refused limit (0 none, 1 tokens, 2 concurrent), retry ms}
_RESERVE_LUA = _COMMON_LUA + """
local tpm, cost, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if most >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= most then return {0, 2, 1000} end
end
if tpm >= 0 then
  local level = level_of(KEYS[1], tpm)
  local want = math.min(cost, tpm)
  if tpm == 0 or level < want then return {0, 1, ms_until(level, math.max(want, 1), tpm)} end
  save(KEYS[1], level - cost, tpm)
end
if most >= 0 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[4])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[5]))
end
return {1, 0, 0}
"""

# KEYS: tokens bucket, in-flight set. ARGV: tpm, tokens to take back (negative: give back), ticket.
_SETTLE_LUA = _COMMON_LUA + """
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and delta ~= 0 then
  save(KEYS[1], math.min(tpm, level_of(KEYS[1], tpm) - delta), tpm)
end
redis.call('ZREM', KEYS[2], ARGV[3])
return 1
"""

# KEYS: in-flight set. ARGV: ticket ttl ms, tickets... Only tickets still there are renewed.
_RENEW_LUA = _COMMON_LUA + """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
"""


@dataclass(frozen=True)
class Bucket:
    """One limit as a check left it: what OpenAI's x-ratelimit-* headers report."""

    limit: int
    remaining: int
    reset_s: float  # until the bucket is full again


@dataclass(frozen=True)
class RequestCheck:
    """The outcome of one client call's requests-per-minute check."""

    admitted: bool
    retry_after_s: float  # when a refused call could pass
    requests: Bucket | None  # None: the tenant has no such limit
    tokens: Bucket | None


@dataclass(frozen=True)
class Reservation:
    """The outcome of one miss's tokens and concurrency check."""

    admitted: bool
    refused_by: str | None  # "tokens_per_minute" or "max_concurrent" when refused
    retry_after_s: float


def _arg(limit: int | None) -> int:
    return NO_LIMIT if limit is None else limit


class TenantCounters:
    """The scripts over one deployment's keys. Calls raise Redis's errors: failing open is the
    caller's decision."""

    def __init__(self, client: Redis, deployment: str) -> None:
        self.client = client
        self.deployment = deployment
        self._request = client.register_script(_REQUEST_LUA)
        self._reserve = client.register_script(_RESERVE_LUA)
        self._settle = client.register_script(_SETTLE_LUA)
        self._renew = client.register_script(_RENEW_LUA)

    def key(self, tenant: str, what: str) -> str:
        return f"{KEY_PREFIX}{{{self.deployment}:{tenant_tag(tenant)}}}:{what}"

    async def check_request(self, tenant: str, rpm: int | None, tpm: int | None) -> RequestCheck:
        """Take one request from the tenant's requests bucket (when it has that limit), and read its
        tokens bucket (for the headers)."""
        keys = [self.key(tenant, "requests"), self.key(tenant, "tokens")]
        out = [int(v) for v in await self._request(keys=keys, args=[_arg(rpm), _arg(tpm)])]
        admitted, req_left, req_reset, retry, tok_left, tok_reset = out
        return RequestCheck(
            admitted=bool(admitted),
            retry_after_s=retry / 1000,
            requests=None if rpm is None else Bucket(rpm, req_left, req_reset / 1000),
            tokens=None if tpm is None else Bucket(tpm, tok_left, tok_reset / 1000),
        )

    async def reserve(
        self, tenant: str, tpm: int | None, cost: int, max_concurrent: int | None, ticket: str,
        ticket_ttl_ms: int,
    ) -> Reservation:
        """Admit one miss: a place among the tenant's in-flight misses and `cost` tokens, both or
        neither."""
        keys = [self.key(tenant, "tokens"), self.key(tenant, "inflight")]
        args = [_arg(tpm), cost, _arg(max_concurrent), ticket, ticket_ttl_ms]
        admitted, refused, retry = (int(v) for v in await self._reserve(keys=keys, args=args))
        refused_by = {1: "tokens_per_minute", 2: "max_concurrent"}.get(refused)
        return Reservation(bool(admitted), refused_by, retry / 1000)

    async def settle(self, tenant: str, tpm: int | None, delta: int, ticket: str) -> None:
        """A generation ended: take `delta` more tokens (negative: give them back), free its ticket."""
        keys = [self.key(tenant, "tokens"), self.key(tenant, "inflight")]
        await self._settle(keys=keys, args=[_arg(tpm), delta, ticket])

    async def renew(self, tenant: str, tickets: list[str], ticket_ttl_ms: int) -> None:
        """Keep this replica's open tickets of `tenant` from expiring."""
        if tickets:
            await self._renew(keys=[self.key(tenant, "inflight")], args=[ticket_ttl_ms, *tickets])
