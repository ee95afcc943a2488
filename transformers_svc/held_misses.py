"""Misses held while the predictor is not ready (starting, restarting, at zero behind Knative's
activator), with --predictor-hold-s on: how many each tenant has held (capped by
--held-misses-per-tenant; past it a miss is refused with 503 and Retry-After), the one readiness
wait they share, and how long the predictor takes to become ready, as this transformer measured it
(the Retry-After of a refusal: the start time left).

Bookkeeping only: asking the predictor whether it is ready is the caller's `probe`
(transformers_svc/predictor_client.py asks its gRPC ServerReady).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from semserve.errors import Overloaded, Unavailable
from semserve.logs import get_logger
from transformers_svc import metrics

log = get_logger("semserve.transformer.held")

# A wake shorter than this is a reconnect, not a predictor start: it does not replace the estimate.
_SHORTEST_START_S = 1.0
# The longest one readiness question may take (a predictor that does not answer is not ready).
_PROBE_TIMEOUT_S = 2.0

# Whether the predictor is ready, asked once; the argument is how long the question may take.
Probe = Callable[[float], Awaitable[bool]]


class HeldMisses:
    """The misses waiting for the predictor to become ready, per tenant."""

    def __init__(
        self,
        model: str,
        cap_per_tenant: int,
        start_estimate_s: float,
        probe: Probe,
        poll_s: float = 0.5,
    ) -> None:
        self.model = model
        self.cap_per_tenant = cap_per_tenant
        # How long the predictor takes from the first held miss to ready: the setting until a wake
        # was measured, then the last one measured.
        self.start_estimate_s = start_estimate_s
        self.probe = probe
        self.poll_s = poll_s
        self.held: dict[str, int] = {}
        self.waking_since: float | None = None  # time.monotonic() of the current wake's first miss
        self._wake: asyncio.Task[bool] | None = None
        metrics.PREDICTOR_START_ESTIMATE.labels(model).set(start_estimate_s)

    @property
    def total(self) -> int:
        return sum(self.held.values())

    def retry_after_s(self) -> float:
        """When a refused miss may pass: the predictor's start time left, as far as it is known."""
        if self.waking_since is None:
            return self.start_estimate_s
        return max(1.0, self.start_estimate_s - (time.monotonic() - self.waking_since))

    async def wait_ready(self, tenant: str, within_s: float) -> None:
        """Hold one miss of `tenant` until the predictor is ready. Overloaded (503, Retry-After) when
        the tenant has its cap of held misses already; Unavailable (503) when it is not ready within
        `within_s`."""
        if self.held.get(tenant, 0) >= self.cap_per_tenant:
            metrics.HELD_MISSES_REFUSED.labels(self.model, tenant).inc()
            retry = self.retry_after_s()
            log.info("held_miss_refused", tenant=tenant, held=self.held[tenant],
                     retry_after_s=round(retry, 1))
            raise Overloaded(
                f"the predictor is starting and {self.cap_per_tenant} requests of this tenant already "
                f"wait for it; retry in about {retry:.0f} s",
                retry_after_s=retry,
            )
        self._change(tenant, +1)
        try:
            wake = self._wake_task()
            try:
                ready = await asyncio.wait_for(asyncio.shield(wake), within_s)
            except TimeoutError:
                ready = False
            if not ready:
                raise Unavailable(f"predictor not ready after {within_s:g} s of waiting for it")
        finally:
            self._change(tenant, -1)

    def _wake_task(self) -> asyncio.Task[bool]:
        """The wait every held miss shares: one probe at a time, whatever the number held."""
        if self._wake is None or self._wake.done():
            self.waking_since = time.monotonic()
            self._wake = asyncio.ensure_future(self._until_ready(self.waking_since))
            log.info("predictor_waking", held=self.total, expected_s=round(self.start_estimate_s, 1))
        return self._wake

    async def _until_ready(self, since: float) -> bool:
        """Ask until the predictor is ready (True), or nobody waits any more (False)."""
        try:
            while self.total > 0:
                if await self.probe(_PROBE_TIMEOUT_S):
                    self._became_ready(time.monotonic() - since)
                    return True
                await asyncio.sleep(self.poll_s)
            return False
        finally:
            self.waking_since = None

    def _became_ready(self, took_s: float) -> None:
        log.info("predictor_ready", waited_s=round(took_s, 1), held=self.total)
        if took_s >= _SHORTEST_START_S:
            self.start_estimate_s = took_s
            metrics.PREDICTOR_START_ESTIMATE.labels(self.model).set(took_s)

    def _change(self, tenant: str, by: int) -> None:
        count = self.held.get(tenant, 0) + by
        if count:
            self.held[tenant] = count
        else:
            self.held.pop(tenant, None)
        metrics.HELD_MISSES.labels(self.model, tenant).set(count)

    async def close(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._wake
