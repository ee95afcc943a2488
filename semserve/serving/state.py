"""What the HTTP and gRPC guards share: the drain flag and the count of requests in flight, and which
paths are never work (probes and scrapes)."""

from __future__ import annotations

import asyncio

# Probes and scrapes are never refused or counted as work, or a draining pod could not report it.
EXEMPT_PATHS = ("/v2/health/live", "/v2/health/ready", "/metrics", "/")


class ServingState:
    """Drain flag and in-flight count shared by the HTTP and gRPC guards."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, limit_s: float) -> bool:
        try:
            async with asyncio.timeout(limit_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False
