"""Per-tenant admission: the limits of --tenant-limits-file checked in the cache's Redis, shared by
every replica (cache/tenant_counters.py), then the fair queue's turn (transformers_svc/fair_queue.py).

Two checks, each one script:
- `check_request`, once per client call at the protocol edge, hits included: requests per minute.
  It also reads the tokens bucket, for OpenAI's x-ratelimit-* headers (`RateInfo.headers`).
- `admit`, at the pipeline's one miss point, before a generation calls the predictor: the miss
  reserves its estimated tokens (prompt tokens estimated from its characters + max_tokens) and a
  place among the tenant's misses in flight. The returned Ticket settles to the real usage when the
  generation ends (complete, cut short or cancelled) and frees the place.

Tenants without limits never reach Redis. Redis down or slow past the budget: the check passes
(fail open), counted in semserve_tenant_limits_fail_open_total, with one warning line per outage
and one line when Redis answers again; while it is down, checks skip it (one probe per retry
interval), so an outage costs requests nothing.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from redis.exceptions import RedisError

from cache.tenant_counters import Bucket, TenantCounters
from semserve.answer import Piece
from semserve.errors import RateLimited
from semserve.logs import get_logger
from semserve.openai_protocol import ChatPrompt, TokenPrompt
from transformers_svc import metrics
from transformers_svc.tenant_quota import TenantQuotas

log = get_logger("semserve.transformer.limits")

T = TypeVar("T")

TICKET_TTL_MS = 30_000  # an in-flight ticket not renewed for this long (its replica died) expires
DEFAULT_TOKENS_PER_CHAR = 0.3  # prompt tokens per character before any usage was reported
LEARN_WEIGHT = 0.05  # weight of each reported prompt in the learned tokens-per-character ratio


def go_duration(seconds: float) -> str:
    """A duration the way OpenAI's x-ratelimit-reset-* headers write it (Go's format): "20ms",
    "1s", "1.5s", "6m0s", "1h0m0s"."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


@dataclass(frozen=True)
class RateInfo:
    """A client call's limits as its check found them (None: no such limit, or not checked), and
    its refusal when it is over its requests per minute."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    refusal: RateLimited | None = None

    def headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers, a set for each limit the tenant has."""
        out: dict[str, str] = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                out[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
                out[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining)
                out[f"x-ratelimit-reset-{name}"] = go_duration(bucket.reset_s)
        return out


UNCHECKED = RateInfo()


class TokenEstimate:
    """Prompt tokens from characters, with a tokens-per-character ratio learned from the prompt
    tokens the predictor reports (a moving average: the tokenizer and the prompts' language set it)."""

    def __init__(self) -> None:
        self.per_char = DEFAULT_TOKENS_PER_CHAR
        self.learned = 0  # reported prompts so far

    def tokens(self, chars: int) -> tuple[int, str]:
        """The estimate and how it was made (for the debug log)."""
        how = f"learned {self.per_char:.3f}/char" if self.learned else f"default {self.per_char}/char"
        return math.ceil(chars * self.per_char), how

    def learn(self, chars: int, prompt_tokens: int) -> None:
        if chars <= 0 or prompt_tokens <= 0:
            return
        ratio = prompt_tokens / chars
        self.per_char = ratio if not self.learned else self.per_char + LEARN_WEIGHT * (ratio - self.per_char)
        self.learned += 1


def prompt_chars(prompt: str | ChatPrompt) -> int:
    if isinstance(prompt, ChatPrompt):
        return sum(len(m.text) for m in prompt.messages)
    return len(prompt)


class FairSlot(Protocol):
    def release(self, prompt_tokens: int, completion_tokens: int) -> None: ...


class FairAdmission(Protocol):
    """transformers_svc/fair_queue.py's FairQueue as admission uses it."""

    async def acquire(self, tenant: str, weight: float, cost_tokens: int) -> FairSlot: ...


class Ticket:
    """One admitted miss: what it reserved, to settle once when its generation ends."""

    def __init__(
        self, admission: Admission | None, tenant: str, tpm: int | None, chars: int, cost: int
    ) -> None:
        self.admission, self.tenant, self.tpm, self.chars, self.cost = admission, tenant, tpm, chars, cost
        self.id = secrets.token_hex(8)
        self.held = False  # reserved in Redis (not failed open, not unlimited)
        self.slot: FairSlot | None = None
        self.settled = False

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The generation ended with this usage (0, 0 when it never reached the predictor). Never
        raises and never waits: Redis is told in the background."""
        if self.settled or self.admission is None:
            return
        self.settled = True
        self.admission.settled(self, prompt_tokens, completion_tokens)


NO_TICKET = Ticket(None, "", None, 0, 0)


class Metered:
    """A generation's pieces that settle its admission ticket when they end, however they end
    (finished, failed, closed unread), with the usage of the last piece seen."""

    def __init__(self, pieces: AsyncIterator[Piece], ticket: Ticket) -> None:
        self._pieces, self._ticket = pieces, ticket
        self._last: Piece | None = None

    def __aiter__(self) -> Metered:
        return self

    async def __anext__(self) -> Piece:
        try:
            piece = await anext(self._pieces)
        except BaseException:  # the end (StopAsyncIteration), a failure, or the client left
            self._settle()
            raise
        self._last = piece
        return piece

    async def aclose(self) -> None:
        self._settle()
        await self._pieces.aclose()  # type: ignore[attr-defined]

    def _settle(self) -> None:
        last = self._last
        self._ticket.settle(last.prompt_tokens if last else 0, last.completion_tokens if last else 0)


class _Outage:
    """Fail open on Redis with one line per outage: while down, checks skip Redis, one probe per
    `retry_s`."""

    def __init__(self, model: str, retry_s: float) -> None:
        self.model, self.retry_s = model, retry_s
        self.down = False
        self._probe_at = 0.0

    def skip(self) -> bool:
        if not self.down:
            return False
        now = time.monotonic()
        if now >= self._probe_at:
            self._probe_at = now + self.retry_s
            return False
        return True

    def failed(self, exc: BaseException) -> None:
        if not self.down:
            log.warning("tenant_limits_fail_open", error=f"{type(exc).__name__}: {exc}",
                        effect="limits are not enforced until Redis answers")
        self.down = True
        self._probe_at = time.monotonic() + self.retry_s

    def ok(self) -> None:
        if self.down:
            self.down = False
            log.info("tenant_limits_enforced_again")


class Admission:
    def __init__(
        self,
        model: str,
        quotas: TenantQuotas,
        counters: TenantCounters | None,
        budget_s: float,
        retry_s: float,
        fair: FairAdmission | None = None,
    ) -> None:
        self.model = model
        self.quotas = quotas
        self.counters = counters
        self.budget_s = budget_s
        self.fair = fair
        self.estimate = TokenEstimate()
        self._outage = _Outage(model, retry_s)
        self._open: dict[str, set[str]] = {}  # tenant -> this replica's tickets in flight
        self._tasks: set[asyncio.Future[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        metrics.TENANT_LIMITS_FAIL_OPEN.labels(model)

    def start(self) -> None:
        """Background work, in the running loop: the file's reload and the tickets' renewal."""
        self.quotas.start()
        if self._renewer is None and self.counters is not None:
            self._renewer = asyncio.ensure_future(self._renew())

    # -- Redis, failing open ------------------------------------------------------------------------

    async def _redis(self, call: Awaitable[T]) -> T | None:
        """The call's result, or None when Redis is down or slow (the check passes)."""
        if self._outage.skip():
            _close(call)
            metrics.TENANT_LIMITS_FAIL_OPEN.labels(self.model).inc()
            return None
        try:
            async with asyncio.timeout(self.budget_s):
                result = await call
        except (RedisError, OSError, TimeoutError) as exc:
            metrics.TENANT_LIMITS_FAIL_OPEN.labels(self.model).inc()
            self._outage.failed(exc)
            return None
        self._outage.ok()
        return result

    # -- the checks ---------------------------------------------------------------------------------

    async def check_request(self, tenant: str) -> RateInfo:
        """One client call of `tenant`: take one from its requests per minute. A refusal comes back
        in the RateInfo (with the headers a 429 carries too), for the caller to raise."""
        limits = self.quotas.of(tenant)
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if self.counters is None or (rpm is None and tpm is None):
            return UNCHECKED
        check = await self._redis(self.counters.check_request(tenant, rpm, tpm))
        if check is None:
            return UNCHECKED
        refusal = None
        if not check.admitted:
            retry = _seconds(check.retry_after_s)
            refusal = RateLimited(
                f"tenant {tenant!r} is over its requests_per_minute limit ({rpm} requests per "
                f"minute); retry after {retry} s", "requests_per_minute", check.retry_after_s,
            )
            metrics.TENANT_REFUSED.labels(self.model, tenant, "requests_per_minute").inc()
        return RateInfo(check.requests, check.tokens, refusal)

    async def admit(
        self, tenant: str, prompt: str | ChatPrompt | TokenPrompt, max_tokens: int, request_id: str
    ) -> Ticket:
        """Admit one miss of `tenant` before its generation calls the predictor, or raise
        RateLimited (its tokens per minute or max_concurrent; the fair queue's share) or Overloaded
        (the fair queue: the predictor is saturated), before any work."""
        limits = self.quotas.of(tenant)
        if isinstance(prompt, TokenPrompt):
            # Counted, not estimated; 0 characters, so nothing is learned from it.
            chars, prompt_tokens, how = 0, len(prompt.ids), "token ids"
        else:
            chars = prompt_chars(prompt)
            prompt_tokens, how = self.estimate.tokens(chars)
        cost = prompt_tokens + max_tokens
        tpm, most = limits.tokens_per_minute, limits.max_concurrent
        ticket = Ticket(self, tenant, tpm, chars, cost)
        if self.counters is not None and (tpm is not None or most is not None):
            reservation = await self._redis(
                self.counters.reserve(tenant, tpm, cost, most, ticket.id, TICKET_TTL_MS)
            )
            if reservation is not None and not reservation.admitted:
                reason = reservation.refused_by or "tokens_per_minute"
                metrics.TENANT_REFUSED.labels(self.model, tenant, reason).inc()
                raise self._refusal(tenant, reason, tpm, most, cost, reservation.retry_after_s)
            if reservation is not None:
                ticket.held = True
                if most is not None:
                    self._open.setdefault(tenant, set()).add(ticket.id)
        if self.fair is not None:
            try:
                ticket.slot = await self.fair.acquire(tenant, limits.weight, cost)
            except BaseException:
                ticket.settle(0, 0)  # gives the reservation back
                raise
        metrics.TENANT_TOKENS_ADMITTED.labels(self.model, tenant).inc(cost)
        log.debug("tenant_miss_admitted", tenant=tenant, request_id=request_id, reserved_tokens=cost,
                  prompt_tokens_estimate=prompt_tokens, estimate=how, max_tokens=max_tokens)
        return ticket

    @staticmethod
    def _refusal(
        tenant: str, reason: str, tpm: int | None, most: int | None, cost: int, retry_s: float
    ) -> RateLimited:
        retry = _seconds(retry_s)
        if reason == "max_concurrent":
            text = (f"tenant {tenant!r} is over its max_concurrent limit ({most} misses in flight at "
                    f"the predictor); retry after {retry} s")
        else:
            text = (f"tenant {tenant!r} is over its tokens_per_minute limit ({tpm} tokens per minute; "
                    f"this request reserves {cost}: prompt estimate + max_tokens); retry after {retry} s")
        return RateLimited(text, reason, retry_s)

    # -- the end of a generation --------------------------------------------------------------------

    def settled(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        used = prompt_tokens + completion_tokens
        if used:
            metrics.TENANT_TOKENS_USED.labels(self.model, ticket.tenant).inc(used)
        self.estimate.learn(ticket.chars, prompt_tokens)
        if ticket.slot is not None:
            ticket.slot.release(prompt_tokens, completion_tokens)
        if not ticket.held or self.counters is None:
            return
        open_ = self._open.get(ticket.tenant)
        if open_ is not None:
            open_.discard(ticket.id)
            if not open_:
                del self._open[ticket.tenant]
        call = self.counters.settle(ticket.tenant, ticket.tpm, used - ticket.cost, ticket.id)
        try:
            task = asyncio.ensure_future(self._redis(call))
        except RuntimeError:  # no running loop (shutting down): the ticket expires on its own
            _close(call)
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self) -> None:
        assert self.counters is not None
        while True:
            await asyncio.sleep(TICKET_TTL_MS / 3000)
            for tenant, tickets in list(self._open.items()):
                await self._redis(self.counters.renew(tenant, list(tickets), TICKET_TTL_MS))


def _seconds(retry_s: float) -> int:
    return max(1, math.ceil(retry_s))


def _close(call: Awaitable[Any]) -> None:
    close = getattr(call, "close", None)  # a coroutine never awaited: no "never awaited" warning
    if close is not None:
        close()
