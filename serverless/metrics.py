"""The metric side of Knative's KPA, in Python: 1-second buckets, stable/panic window averages, the
max-over-time window used by scale-down-delay, and the collector that feeds the decider.

Written after `pkg/autoscaler/aggregation/bucketing.go`, `aggregation/max/` and
`pkg/autoscaler/metrics/collector.go` in knative/serving. Times are float seconds from any origin
(the simulation starts at 0); buckets are addressed by `floor(t / granularity)`, as Knative does with
`t.Unix() / granularity`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

# Knative constants (pkg/autoscaler/config/config.go, scaling/multiscaler.go, metrics/collector.go).
BUCKET_SIZE_S = 1.0
SCRAPE_INTERVAL_S = 1.0
TICK_INTERVAL_S = 2.0
_PRECISION_DIGITS = 6
# WeightedFloat64Buckets constants.
_MIN_EXPONENT = 0.2
_WEIGHT_PRECISION = 0.9999


def _index(t: float, granularity: float) -> int:
    # A tiny epsilon so that 3.0000000001-style float noise from event arithmetic lands where 3.0 would.
    return math.floor(t / granularity + 1e-9)


class WindowAverager(Protocol):
    def record(self, now: float, value: float) -> None: ...
    def window_average(self, now: float) -> float: ...
    def is_empty(self, now: float) -> bool: ...


class TimedBuckets:
    """Linear window average over `window` seconds of `granularity`-second buckets.

    As Knative's `TimedFloat64Buckets`: the average is over the part of the window seen so far (from the
    first write after a quiet window), trailing buckets without data since the last write are dropped,
    gaps inside the data count as zeros, and a whole window without writes gives 0.
    """

    def __init__(self, window: float, granularity: float = BUCKET_SIZE_S) -> None:
        if window <= 0 or granularity <= 0:
            raise ValueError("window and granularity must be positive")
        self.window = window
        self.granularity = granularity
        self.buckets: list[float] = [0.0] * math.ceil(window / granularity - 1e-9)
        self.first_write: int | None = None  # bucket indices, not times
        self.last_write: int | None = None
        self.window_total = 0.0

    def is_empty(self, now: float) -> bool:
        if self.last_write is None:
            return True
        return (_index(now, self.granularity) - self.last_write) * self.granularity > self.window

    def record(self, now: float, value: float) -> None:
        b = _index(now, self.granularity)
        n = len(self.buckets)
        if self.last_write != b:
            last = self.last_write
            # Values older than a window before the last write are dropped (Knative ignores them too).
            if last is not None and (b - last) * self.granularity <= -self.window:
                return
            if self.first_write is None or self.first_write > b:
                self.first_write = b
            if last is None or b > last:
                if last is None or (b - last) * self.granularity >= self.window:
                    # A whole window without writes: start afresh, the average becomes partial again.
                    self.first_write = b
                    self.buckets = [0.0] * n
                    self.window_total = 0.0
                else:
                    # Zero the buckets skipped since the last write, they belong to an older lap.
                    for i in range(last + 1, b + 1):
                        self.window_total -= self.buckets[i % n]
                        self.buckets[i % n] = 0.0
                self.last_write = b
        self.buckets[b % n] += value
        self.window_total += value

    def window_average(self, now: float) -> float:
        if self.last_write is None or self.first_write is None:
            return 0.0
        b = _index(now, self.granularity)
        n = len(self.buckets)
        d = b - self.last_write
        seen = self.last_write - self.first_write + 1  # +1: both ends inclusive
        if d <= 0:
            return round(self.window_total / min(seen, n), _PRECISION_DIGITS)
        if d * self.granularity < self.window:
            # No data for less than a window: drop the buckets that went stale and average the rest.
            total = self.window_total
            for i in range(self.last_write + 1, b + 1):
                total -= self.buckets[i % n]
            return round(total / min(seen, n - d), _PRECISION_DIGITS)
        return 0.0


class WeightedBuckets(TimedBuckets):
    """`metric-aggregation-algorithm: weighted-exponential`: newer buckets weigh more."""

    def __init__(self, window: float, granularity: float = BUCKET_SIZE_S) -> None:
        super().__init__(window, granularity)
        nb = math.ceil(window / granularity - 1e-9)
        self.smoothing = max(1 - math.pow(1 - _WEIGHT_PRECISION, 1 / nb), _MIN_EXPONENT)

    def window_average(self, now: float) -> float:
        if self.is_empty(now) or self.last_write is None:
            return 0.0
        b = _index(now, self.granularity)
        n = len(self.buckets)
        num = n
        mult = self.smoothing
        if b > self.last_write:
            zeros = b - self.last_write
            mult *= math.pow(1 - self.smoothing, zeros)
            num -= zeros
        out = 0.0
        for i in range(num):
            out += self.buckets[(self.last_write - i) % n] * mult
            mult *= 1 - self.smoothing
        return out


class MaxTimeWindow:
    """Maximum of the values recorded over the last `duration` seconds, in `granularity` steps.

    Knative's `max.TimeWindow` (descending-minima deque); the decider records its desired count here
    when `scale-down-delay` is set and applies the maximum, so a scale-down waits for the whole delay.
    """

    def __init__(self, duration: float, granularity: float = TICK_INTERVAL_S) -> None:
        self.size = math.ceil(duration / granularity - 1e-9)
        self.granularity = granularity
        self._maxima: deque[tuple[int, int]] = deque()  # (index, value), values strictly descending

    def record(self, now: float, value: int) -> None:
        index = _index(now, self.granularity)
        # Smaller values recorded before can never be the maximum again.
        while self._maxima and value >= self._maxima[-1][1]:
            self._maxima.pop()
        while self._maxima and index - self._maxima[0][0] >= self.size:
            self._maxima.popleft()
        if self._maxima and self._maxima[-1][0] == index:
            # Same index recorded twice: keep the larger (Knative step 2b).
            value = max(value, self._maxima.pop()[1])
        self._maxima.append((index, value))

    def current(self) -> int:
        return self._maxima[0][1] if self._maxima else 0


def panic_window_seconds(stable_window: float, panic_window_percentage: float) -> float:
    """`MakeMetric`: stable × pct/100, rounded to the second, at least one bucket."""
    panic = _round_half_away(stable_window * panic_window_percentage / 100.0)
    return max(panic, BUCKET_SIZE_S)


def _round_half_away(x: float) -> float:
    # Go's Duration.Round rounds halves away from zero; Python's round() would round them to even.
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


@dataclass
class Stat:
    """One report, as a queue-proxy scrape or an activator report: concurrency summed over the revision."""

    concurrency: float
    proxied_concurrency: float = 0.0
    requests: float = 0.0
    proxied_requests: float = 0.0


class MetricCollector:
    """Stable and panic windows for concurrency and RPS of one revision (`collection` in collector.go)."""

    def __init__(
        self,
        stable_window: float,
        panic_window: float,
        algorithm: str = "linear",
        scrape_target: bool = True,
    ) -> None:
        ctor = (
            WeightedBuckets if algorithm in ("weighted-exponential", "weightedExponential") else TimedBuckets
        )
        self.concurrency_stable: TimedBuckets = ctor(stable_window)
        self.concurrency_panic: TimedBuckets = ctor(panic_window)
        self.rps_stable: TimedBuckets = ctor(stable_window)
        self.rps_panic: TimedBuckets = ctor(panic_window)
        # Knative has no scrape target when TBC = -1 (activator always in path); then "no data" is 0, not
        # an error.
        self.scrape_target = scrape_target

    def record(self, now: float, stat: Stat) -> None:
        # Requests the activator proxied were counted by it already; subtract so they count once.
        concurrency = stat.concurrency - stat.proxied_concurrency
        rps = stat.requests - stat.proxied_requests
        self.concurrency_stable.record(now, concurrency)
        self.concurrency_panic.record(now, concurrency)
        self.rps_stable.record(now, rps)
        self.rps_panic.record(now, rps)

    def stable_and_panic_concurrency(self, now: float) -> tuple[float, float] | None:
        """None stands for Knative's ErrNoData: the decider makes no decision this tick."""
        if self.concurrency_stable.is_empty(now) and self.scrape_target:
            return None
        return self.concurrency_stable.window_average(now), self.concurrency_panic.window_average(now)

    def stable_and_panic_rps(self, now: float) -> tuple[float, float] | None:
        if self.rps_stable.is_empty(now) and self.scrape_target:
            return None
        return self.rps_stable.window_average(now), self.rps_panic.window_average(now)
