"""The simulation's clock: a time-ordered event queue, and the revision's concurrency integrated over it."""

from __future__ import annotations

import heapq
from enum import Enum
from itertools import count
from typing import Any

# Float slack when comparing event times (a pod's prefill end, the last scrape before the end).
EPS = 1e-9


class EventKind(Enum):
    ARRIVE = "arrive"  # payload: (Arrival, index)
    POD = "pod"  # payload: (Pod, version): a running request finishes prefill or decode
    POD_READY = "pod_ready"  # payload: Pod
    DEADLINE = "deadline"  # payload: Request: the revision timeout passes
    SCRAPE = "scrape"  # once a second: metrics into the windows
    TICK = "tick"  # every 2 s: the decider


class EventQueue:
    """Events popped in time order; ties in the order they were pushed, so a run is deterministic."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, EventKind, Any]] = []
        self._seq = count()
        self.now = 0.0

    def push(self, t: float, kind: EventKind, payload: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def every(self, interval: float, kind: EventKind, until: float) -> None:
        """One event each `interval` seconds from `interval` up to `until` (inclusive)."""
        t = interval
        while t <= until + EPS:
            self.push(t, kind)
            t += interval

    def pop(self) -> tuple[float, EventKind, Any]:
        t, _, kind, payload = heapq.heappop(self._heap)
        return t, kind, payload

    def __bool__(self) -> bool:
        return bool(self._heap)


class ConcurrencyMeter:
    """Predictor-bound requests in the revision (held by the activator or in pods), integrated over
    time: the pods and the activator report the average over each scrape interval, not a snapshot."""

    def __init__(self) -> None:
        self.count = 0
        self._area = 0.0
        self._area_t = 0.0
        self._area_at_report = 0.0
        self._last_report = 0.0

    def _integrate(self, now: float) -> None:
        self._area += self.count * (now - self._area_t)
        self._area_t = now

    def add(self, now: float) -> None:
        self._integrate(now)
        self.count += 1

    def remove(self, now: float) -> None:
        self._integrate(now)
        self.count -= 1

    def average_since_last_report(self, now: float) -> float:
        self._integrate(now)
        interval = now - self._last_report
        avg = (self._area - self._area_at_report) / interval if interval > 0 else float(self.count)
        self._area_at_report, self._last_report = self._area, now
        return avg
