"""Window averages and the max window, after knative/serving pkg/autoscaler/aggregation/*_test.go."""

from __future__ import annotations

import pytest

from serverless.metrics import (
    MaxTimeWindow,
    MetricCollector,
    Stat,
    TimedBuckets,
    WeightedBuckets,
    panic_window_seconds,
)


def test_timed_buckets_window_average() -> None:
    # TestTimedFloat64BucketsWindowAverage (5 s window, 1 s buckets), now not on a second boundary.
    now = 1000.3
    b = TimedBuckets(5.0)
    b.record(now, 1)
    assert b.window_average(now) == 1.0  # partial window: uses firstWrite, not 1/5
    for i in range(1, 5):
        b.record(now + i, i + 1)
    assert b.window_average(now + 4) == 15 / 5
    assert b.window_average(now + 3.6) == 15 / 5  # `now` lagging behind the last write
    assert b.window_average(now + 6) == pytest.approx((15 - 1 - 2) / (5 - 2))  # short hole
    assert b.window_average(now + 10) == 0.0  # long hole
    b.record(now + 6, 91)
    assert b.window_average(now + 6) == pytest.approx((15 - 1 - 2 + 91) / 5)
    now += 60
    b.record(now, 1984)
    assert b.window_average(now) == 1984.0
    b.record(now - 3, 4)  # an earlier time
    assert b.window_average(now) == pytest.approx((4 + 1984) / 4)
    now += 1
    b.record(now, 5)
    assert b.window_average(now) == pytest.approx((4 + 1984 + 5) / 5)
    b.record(now - 3, 10)
    assert b.window_average(now) == pytest.approx((4 + 10 + 1984 + 5) / 5)
    b.record(now - 6, 10)  # too early: ignored
    b.record(now - 5, 10)  # exactly a window back: ignored
    assert b.window_average(now) == pytest.approx((4 + 10 + 1984 + 5) / 5)
    b.record(now + 5, 10)  # after exactly a window without data everything is reset
    assert b.window_average(now + 5) == 10.0


def test_timed_buckets_same_bucket_sums_and_empty() -> None:
    # TestTimedFloat64BucketsSimple: two stats in one second add up (activator + scrape).
    b = TimedBuckets(120.0)
    assert b.is_empty(10.0)
    b.record(10.0, 1.0)
    b.record(10.1, 10.0)
    assert b.window_average(10.5) == 11.0
    assert not b.is_empty(130.0)
    assert b.is_empty(130.0 + 1.0)


def test_weighted_buckets() -> None:
    # TestTimedFloat64BucketsWeightedAverage
    now = 50.0
    b = WeightedBuckets(5.0)
    m = b.smoothing
    b.record(now, 2)
    assert b.window_average(now) == pytest.approx(2 * m)
    assert b.window_average(now + 1) == pytest.approx(2 * m * (1 - m))
    b.record(now + 1, 2)
    assert b.window_average(now + 1) == pytest.approx(2 * m * (1 - m) + 2 * m)
    for i in range(5):
        b.record(now + 2 + i, i + 2)
    want = sum((6 - k) * m * (1 - m) ** k for k in range(5))
    assert b.window_average(now + 6) == pytest.approx(want)
    assert b.window_average(now + 16) == 0.0


@pytest.mark.parametrize(("nb", "want"), [(100, 0.2), (60, 0.2), (40, 0.20567), (6, 0.78456)])
def test_smoothing_coefficient(nb: int, want: float) -> None:
    # TestComputeDecayMultiplier
    assert WeightedBuckets(float(nb)).smoothing == pytest.approx(want, abs=1e-4)


def test_max_time_window() -> None:
    # max.TimeWindow as the scale-down-delay uses it (10 s window, 2 s granularity).
    w = MaxTimeWindow(10.0, 2.0)
    w.record(0, 5)
    w.record(2, 3)
    assert w.current() == 5
    w.record(8, 1)
    assert w.current() == 5
    w.record(10, 1)  # index 5: the 5 at index 0 scrolls out
    assert w.current() == 3
    w.record(10, 4)  # same index twice: the larger counts
    assert w.current() == 4


@pytest.mark.parametrize(
    ("stable", "pct", "want"), [(60, 10, 6), (6, 10, 1), (6, 1, 1), (25, 10, 3), (35, 10, 4)]
)
def test_panic_window(stable: float, pct: float, want: float) -> None:
    # MakeMetric: Duration.Round (halves away from zero), at least one bucket.
    assert panic_window_seconds(stable, pct) == want


def test_collector_no_data_and_proxied() -> None:
    c = MetricCollector(60, 6)
    assert c.stable_and_panic_concurrency(5.0) is None  # ErrNoData
    c.record(1.0, Stat(concurrency=10, proxied_concurrency=4))
    assert c.stable_and_panic_concurrency(1.0) == (6.0, 6.0)
    c.record(2.0, Stat(concurrency=0))
    # Stable averages over 2 s seen so far, panic too (both partial).
    assert c.stable_and_panic_concurrency(2.0) == (3.0, 3.0)
    assert MetricCollector(60, 6, scrape_target=False).stable_and_panic_concurrency(5.0) == (0.0, 0.0)


def test_panic_vs_stable_window_react_differently() -> None:
    # 60 s of 1 then 6 s of 10: panic (6 s) sees 10, stable sees the mix.
    c = MetricCollector(60, 6)
    for t in range(60):
        c.record(float(t), Stat(concurrency=1))
    for t in range(60, 66):
        c.record(float(t), Stat(concurrency=10))
    stable, panic = c.stable_and_panic_concurrency(65.0)  # type: ignore[misc]
    assert panic == 10.0
    assert stable == pytest.approx((54 * 1 + 6 * 10) / 60)
