"""Token-fair admission of misses to the predictor (issue 27 item 5), after the tenant's own limits.

VTC (Sheng et al., OSDI'24, "Fairness in Serving Large Language Models"): each tenant has a
virtual counter of the tokens the predictor served it, input tokens weighted 1 and output tokens 2
(VTC's usual choice: a generated token costs a decode step, a prompt token a share of a prefill),
divided by the tenant's weight. Whenever the predictor has room, the backlogged tenant (one with
misses waiting here) with the lowest counter goes next (ties: the earlier miss). A tenant that
becomes backlogged again is lifted to the lowest counter of those backlogged (or, with none, to
the counter of the last tenant admitted), so time spent idle is not banked as credit.

Charges: a miss is charged on admission with an upper bound of what it can cost, its estimated
tokens (prompt estimate + max_tokens, from admission.py) at the output weight, and corrected to
its real usage when it ends (`FairSlot.release`). So a tenant never gets ahead by its estimates:
while its generations run it looks at most as heavy as it could become.

Shedding (item 6): a miss whose estimated wait here, (misses ahead of it in VTC order + 1) / the
measured admission rate, is over `max_wait_s` is refused at once: RateLimited(limit="fair_share")
when its tenant holds more than its weighted share of the predictor (tokens in flight), else
Overloaded (the predictor is saturated for everyone); both with Retry-After ~ the estimated wait.

`Vtc` is the decision, pure and synchronous (tests/transformers_svc/test_fair_queue.py tests it
row by row); `FairQueue` is the asyncio wrapper: `acquire` awaits a future, a cancelled waiter
leaves the queue, `FairSlot.release` charges the real usage and admits the next. The counters are
per replica: the predictor's own saturation signal (transformers_svc/saturation.py) couples the
replicas, so each replica admits only while the shared predictor has room.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from semserve.errors import Overloaded, RateLimited
from semserve.logs import get_logger
from transformers_svc import metrics

log = get_logger("semserve.transformer.fair")

RATE_WINDOW_S = 10.0  # admissions counted for the admission rate


@dataclass(frozen=True)
class VtcWeights:
    input: float = 1.0
    output: float = 2.0


@dataclass(eq=False)
class Waiter:
    """One miss in the queue (then admitted: its slot's bookkeeping)."""

    tenant: str
    weight: float
    cost: int  # estimated tokens: prompt estimate + max_tokens
    seq: int
    arrived: float
    charged: float = 0.0  # virtual units charged on admission, corrected on release
    admitted: bool = False


@dataclass
class _Tenant:
    weight: float = 1.0
    counter: float = 0.0
    queue: deque[Waiter] = field(default_factory=deque)
    in_flight_tokens: int = 0  # estimated tokens of its admitted misses not yet released


class Vtc:
    """The VTC decision: who is next, what each miss is charged, how long a new one would wait."""

    def __init__(self, weights: VtcWeights = VtcWeights(), rate_window_s: float = RATE_WINDOW_S) -> None:
        self.weights = weights
        self.tenants: dict[str, _Tenant] = {}
        self._seq = itertools.count()
        self._last_admitted_counter = 0.0
        self._admissions: deque[float] = deque()  # times of recent admissions
        self.rate_window_s = rate_window_s

    # -- the queue ----------------------------------------------------------------------------------

    def arrive(self, tenant: str, weight: float, cost: int, now: float) -> Waiter:
        t = self.tenants.setdefault(tenant, _Tenant())
        t.weight = weight if weight > 0 else 1.0
        if not t.queue:  # becomes backlogged: no credit for the time it was idle
            others = [o.counter for name, o in self.tenants.items() if o.queue and name != tenant]
            floor = min(others) if others else self._last_admitted_counter
            t.counter = max(t.counter, floor)
        waiter = Waiter(tenant, t.weight, max(0, cost), next(self._seq), now)
        t.queue.append(waiter)
        return waiter

    def next(self, idle_only: bool = False) -> Waiter | None:
        """The miss to admit next: the head of the backlogged tenant with the lowest counter
        (`idle_only`: among tenants with nothing in flight)."""
        heads = [(t.counter, t.queue[0].seq, t.queue[0]) for t in self.tenants.values()
                 if t.queue and not (idle_only and t.in_flight_tokens)]
        return min(heads, key=lambda h: (h[0], h[1]))[2] if heads else None

    def busy(self, tenant: str) -> bool:
        """Whether `tenant` has misses in flight."""
        t = self.tenants.get(tenant)
        return t is not None and t.in_flight_tokens > 0

    def admit(self, waiter: Waiter, now: float) -> None:
        t = self.tenants[waiter.tenant]
        assert t.queue and t.queue[0] is waiter, "only the head of a tenant's queue is admitted"
        t.queue.popleft()
        waiter.charged = self.weights.output * waiter.cost / t.weight
        waiter.admitted = True
        self._last_admitted_counter = t.counter
        t.counter += waiter.charged
        t.in_flight_tokens += waiter.cost
        self._admissions.append(now)
        self._trim(now)

    def cancel(self, waiter: Waiter) -> None:
        """A waiter left before its turn (its client went away, or it was shed)."""
        t = self.tenants.get(waiter.tenant)
        if t is not None and not waiter.admitted:
            try:
                t.queue.remove(waiter)
            except ValueError:
                pass

    def release(self, waiter: Waiter, prompt_tokens: int, completion_tokens: int) -> None:
        """An admitted miss ended: its counter moves from the bound charged to the real usage."""
        t = self.tenants.get(waiter.tenant)
        if t is None or not waiter.admitted:
            return
        used = (self.weights.input * max(0, prompt_tokens) + self.weights.output * max(0, completion_tokens))
        t.counter += used / t.weight - waiter.charged
        t.in_flight_tokens = max(0, t.in_flight_tokens - waiter.cost)
        waiter.admitted = False  # released once

    # -- estimates ----------------------------------------------------------------------------------

    def ahead_of(self, waiter: Waiter) -> int:
        """Misses admitted before `waiter` if the counters advanced by the charges alone: its
        tenant's misses before it, and each other tenant's misses that start below the virtual
        time at which `waiter` would start."""
        own = self.tenants[waiter.tenant]
        start = own.counter
        ahead = 0
        for w in own.queue:
            if w is waiter:
                break
            start += self.weights.output * w.cost / own.weight
            ahead += 1
        for name, t in self.tenants.items():
            if name == waiter.tenant:
                continue
            at = t.counter
            for w in t.queue:
                if at > start or (at == start and w.seq > waiter.seq):
                    break
                at += self.weights.output * w.cost / t.weight
                ahead += 1
        return ahead

    def rate(self, now: float) -> float | None:
        """Admissions per second over the last window; None before two were seen."""
        self._trim(now)
        if len(self._admissions) < 2:
            return None
        span = max(now - self._admissions[0], 1e-3)
        return len(self._admissions) / span

    def wait_s(self, waiter: Waiter, now: float) -> float | None:
        """The estimated wait of `waiter` for its turn; None when no rate is known yet."""
        rate = self.rate(now)
        if rate is None:
            return None
        return (self.ahead_of(waiter) + 1) / rate

    def over_share(self, tenant: str) -> bool:
        """Whether `tenant` holds more than its weighted share of the tokens in flight, among the
        tenants that are backlogged or in flight."""
        active = {n: t for n, t in self.tenants.items() if t.queue or t.in_flight_tokens}
        total_tokens = sum(t.in_flight_tokens for t in active.values())
        own = self.tenants.get(tenant)
        if own is None or total_tokens == 0 or len(active) < 2:
            return False
        total_weight = sum(t.weight for t in active.values())
        return own.in_flight_tokens / total_tokens > own.weight / total_weight

    def depth(self) -> int:
        return sum(len(t.queue) for t in self.tenants.values())

    def _trim(self, now: float) -> None:
        while self._admissions and now - self._admissions[0] > self.rate_window_s:
            self._admissions.popleft()


def refusal(vtc: Vtc, waiter: Waiter, wait_s: float, max_wait_s: float) -> RateLimited | Overloaded | None:
    """The answer to a miss whose estimated wait is `wait_s`: None (it queues), or its refusal."""
    if wait_s <= max_wait_s:
        return None
    retry = max(1, math.ceil(wait_s))
    if vtc.over_share(waiter.tenant):
        return RateLimited(
            f"tenant {waiter.tenant!r} holds more than its share of the predictor (weight "
            f"{waiter.weight:g}) and its miss would wait about {wait_s:.0f} s (over the "
            f"{max_wait_s:g} s bound); retry after {retry} s", "fair_share", wait_s,
        )
    return Overloaded(
        f"the predictor is saturated: this miss would wait about {wait_s:.0f} s (over the "
        f"{max_wait_s:g} s bound); retry after {retry} s", wait_s,
    )


# -- asyncio ----------------------------------------------------------------------------------------


class Room:
    """Whether the predictor takes another miss now (transformers_svc/saturation.py's Saturation)."""

    def has_room(self, busy: bool = False) -> bool:
        return True

    def admitted(self) -> object:
        return None

    def released(self, token: object) -> None:
        return None

    def wanted(self) -> None:
        """A new miss waits for room: look again soon."""

    def waiting(self) -> None:
        """Misses still wait for room (nothing new): keep looking."""

    def on_change(self, callback: Callable[[], None]) -> None:
        """`callback` runs whenever room may have appeared."""


class FairSlot:
    """An admitted miss's place at the predictor, released once when its generation ends."""

    def __init__(self, queue: FairQueue, waiter: Waiter, token: object) -> None:
        self._queue, self._waiter, self._token = queue, waiter, token
        self._released = False
        # A slot dropped unreleased (a generation's pieces never read nor closed) must not hold its
        # place for ever: the Room counts this transformer's misses in flight exactly, no read heals it.
        self._leak = weakref.finalize(self, queue._release_dropped, waiter, token)

    def release(self, prompt_tokens: int, completion_tokens: int) -> None:
        if self._released:
            return
        self._released = True
        self._leak.detach()
        self._queue._release(self._waiter, self._token, prompt_tokens, completion_tokens)


class FairQueue:
    def __init__(
        self,
        model: str,
        room: Room | None = None,
        max_wait_s: float = 60.0,
        weights: VtcWeights = VtcWeights(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.room = room or Room()
        self.max_wait_s = max_wait_s
        self.vtc = Vtc(weights)
        self.clock = clock
        self._futures: dict[Waiter, asyncio.Future[FairSlot]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop misses are admitted on
        self.room.on_change(self._dispatch)
        metrics.ADMISSION_QUEUE_DEPTH.labels(model).set(0)

    async def acquire(self, tenant: str, weight: float, cost_tokens: int) -> FairSlot:
        """Return when this miss's turn came and the predictor has room, or raise its refusal."""
        self._loop = asyncio.get_running_loop()
        now = self.clock()
        waiter = self.vtc.arrive(tenant, weight, cost_tokens, now)
        if self._may_go(waiter):
            slot = self._admit(waiter, now)
            metrics.ADMISSION_QUEUE_SECONDS.labels(self.model, tenant).observe(0.0)
            return slot
        wait_s = self.vtc.wait_s(waiter, now)
        refused = refusal(self.vtc, waiter, wait_s, self.max_wait_s) if wait_s is not None else None
        if refused is not None:
            self.vtc.cancel(waiter)
            reason = "fair_share" if isinstance(refused, RateLimited) else "saturated"
            metrics.TENANT_REFUSED.labels(self.model, tenant, reason).inc()
            log.info("fair_queue_shed", tenant=tenant, reason=reason, wait_estimate_s=round(wait_s or 0, 2),
                     queued=self.vtc.depth())
            raise refused
        future: asyncio.Future[FairSlot] = self._loop.create_future()
        self._futures[waiter] = future
        self._depth()
        self.room.wanted()
        try:
            slot = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # admitted just as its client left
                future.result().release(0, 0)
            else:
                self.vtc.cancel(waiter)
                self._dispatch()  # the head may have changed
            raise
        finally:
            self._futures.pop(waiter, None)
            self._depth()
        metrics.ADMISSION_QUEUE_SECONDS.labels(self.model, tenant).observe(self.clock() - now)
        return slot

    def _admit(self, waiter: Waiter, now: float) -> FairSlot:
        self.vtc.admit(waiter, now)
        return FairSlot(self, waiter, self.room.admitted())

    def _may_go(self, waiter: Waiter) -> bool:
        """Whether `waiter` is admitted now: next in VTC order with room for it, or, when the next
        one's tenant is held off the reserved places, the first of a tenant with nothing in flight."""
        head = self.vtc.next()
        if head is waiter:
            return self.room.has_room(self.vtc.busy(waiter.tenant))
        if head is not None and self.vtc.busy(head.tenant) and self.vtc.next(idle_only=True) is waiter:
            return not self.room.has_room(True) and self.room.has_room(False)
        return False

    def _dispatch(self) -> None:
        """Admit waiters in VTC order while the predictor has room."""
        while (waiter := self.vtc.next()) is not None:
            if not self._awaited(waiter):
                continue
            if not self.room.has_room(self.vtc.busy(waiter.tenant)):
                # The reserved places: for the first waiter of a tenant with nothing in flight.
                idle = self.vtc.next(idle_only=True)
                if idle is not None and self._awaited(idle) and self.room.has_room(False):
                    self._futures[idle].set_result(self._admit(idle, self.clock()))
                    continue
                self.room.waiting()  # not wanted(): a read has just said no room, the next one is due
                return
            self._futures[waiter].set_result(self._admit(waiter, self.clock()))

    def _awaited(self, waiter: Waiter) -> bool:
        future = self._futures.get(waiter)
        if future is None or future.done():  # not awaited (yet, or any more): drop it
            self.vtc.cancel(waiter)
            return False
        return True

    def _release(self, waiter: Waiter, token: object, prompt: int, completion: int) -> None:
        self.vtc.release(waiter, prompt, completion)
        self.room.released(token)
        self._dispatch()

    def _release_dropped(self, waiter: Waiter, token: object) -> None:
        """A slot garbage-collected unreleased (at collection time, maybe in another thread): released
        with no usage on the loop's next turn."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        log.warning("fair_slot_dropped", tenant=waiter.tenant,
                    effect="released with no usage: its pieces were neither read to the end nor closed")
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._release, waiter, token, 0, 0)

    def _depth(self) -> None:
        metrics.ADMISSION_QUEUE_DEPTH.labels(self.model).set(len(self._futures))
