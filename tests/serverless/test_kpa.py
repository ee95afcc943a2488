"""The decider against rows transcribed from knative/serving pkg/autoscaler/scaling/autoscaler_test.go.

Knative's helpers: `newTestAutoscaler(target, tbc, metrics)` builds a spec with TotalValue = target/0.75,
PanicThreshold 2, MaxScaleUp/DownRate 10, StableWindow 60 s, Reachable, one ready pod; `expectedEBC`
is floor(target/0.75*pods - tbc - panic) and EBC is compared with ±1 tolerance (`approxEquateInt32`).
"""

from __future__ import annotations

import math

import pytest

from serverless.kpa import (
    Autoscaler,
    Decider,
    DeciderSpec,
    PAState,
    PodAutoscaler,
    ScalerConfig,
    num_activators,
)

TU = 0.75
STABLE = 60.0
T0 = 1000.0  # Knative uses time.Now(); any fixed origin will do


def spec(target: float, tbc: float, **kw: float | bool | int) -> DeciderSpec:
    base = DeciderSpec(
        target_value=target,
        total_value=target / TU,
        target_burst_capacity=tbc,
        panic_threshold=2.0,
        max_scale_up_rate=10.0,
        max_scale_down_rate=10.0,
        stable_window=STABLE,
        reachable=True,
        activator_capacity=150.0,
    )
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def ebc(target: float, tbc: float, recorded: float, pods: float) -> int:
    return math.floor(target / TU * pods - tbc - recorded)


def expect(
    a: Autoscaler, now: float, stable: float, panic: float, ready: int, pods: int, want_ebc: int
) -> None:
    r = a.scale(now, stable, panic, ready)
    assert r.scale_valid
    assert r.desired_pod_count == pods
    assert abs(r.excess_burst_capacity - want_ebc) <= 1  # Knative's approxEquateInt32


# TestAutoscalerScale table: (label, target, tbc, stable, panic, ready, prep, want_scale, want_ebc)
SCALE_TABLE = [
    ("AutoscalerNoDataAtZeroNoAutoscale", 10, 100, 0, 0, 1, {}, 0, ebc(10, 100, 0, 1)),
    ("AutoscalerStableModeUnlimitedTBC", 181, -1, 21, 26, 1, {}, 1, -1),
    ("Autoscaler0TBC", 10, 0, 50, 49, 1, {}, 5, 0),
    ("AutoscalerStableModeNoChange", 10, 100, 50, 50, 1, {}, 5, ebc(10, 100, 50, 1)),
    ("AutoscalerPanicStableLargerThanPanic", 1, 100, 50, 30, 5, {"panic": True}, 50, ebc(1, 100, 30, 5)),
    ("AutoscalerPanicStableLessThanPanic", 1, 100, 20, 30, 5, {"panic": True}, 30, ebc(1, 100, 30, 5)),
    ("AutoscalerStableModeNoChangeAlreadyScaled", 10, 100, 50, 50, 5, {}, 5, ebc(10, 100, 50, 5)),
    ("AutoscalerStableModeIncreaseWithSmallScaleUpRate", 1, 1982, 3, 3.1, 2,
     {"max_scale_up_rate": 1.1}, 3, ebc(1, 1982, 3.1, 2)),
    ("AutoscalerStableModeDecreaseWithSmallScaleDownRate", 10, 1982, 1, 1, 100,
     {"max_scale_down_rate": 1.1}, 90, ebc(10, 1982, 1, 100)),
    ("AutoscalerStableModeDecreaseNonReachable", 10, 1982, 1, 1, 100,
     {"max_scale_down_rate": 1.1, "reachable": False}, 1, ebc(10, 1982, 1, 100)),
    ("AutoscalerPanicModeDoublePodCount", 10, 84, 50, 100, 1, {}, 10, ebc(10, 84, 100, 1)),
]  # fmt: skip


@pytest.mark.parametrize("row", SCALE_TABLE, ids=[r[0] for r in SCALE_TABLE])
def test_autoscaler_scale_table(row: tuple) -> None:
    _, target, tbc, stable, panic, ready, prep, want, want_ebc = row
    prep = dict(prep)
    in_panic = prep.pop("panic", False)
    a = Autoscaler(spec(target, tbc, **prep))
    if in_panic:
        # prepFunc: panicTime = now-5s, maxPanicPods = 5
        a.panic_time, a.max_panic_pods = T0 - 5, 5
    expect(a, T0, stable, panic, ready, want, want_ebc)


def test_stable_mode_increase_with_concurrency_default() -> None:
    # TestAutoscalerStableModeIncreaseWithConcurrencyDefault
    a = Autoscaler(spec(10, 101))
    expect(a, T0, 50, 10, 1, 5, ebc(10, 101, 10, 1))
    expect(a, T0, 100, 10, 1, 10, ebc(10, 101, 10, 1))


def test_stable_mode_increase_with_rps() -> None:
    # TestAutoscalerStableModeIncreaseWithRPS: same arithmetic on the RPS windows.
    a = Autoscaler(spec(10, 101, scaling_metric="rps"))
    expect(a, T0, 50, 50, 1, 5, ebc(10, 101, 50, 1))
    expect(a, T0, 100, 99, 1, 10, ebc(10, 101, 99, 1))


def test_metrics_row() -> None:
    # TestAutoscalerMetrics / TestAutoscalerMetricsWithRPS (the scale results, not the OTel gauges).
    expect(Autoscaler(spec(10, 100)), T0, 50, 50, 1, 5, ebc(10, 100, 50, 1))
    expect(Autoscaler(spec(10, 100)), T0 + 61, 100, 99, 1, 10, ebc(10, 100, 99, 1))


def test_unpanic_after_slow_increase() -> None:
    # TestAutoscalerUnpanicAfterSlowIncrease
    a = Autoscaler(spec(1, 98))
    tm = T0
    expect(a, tm, 11, 25, 10, 25, ebc(1, 98, 25, 10))
    assert a.panic_time == tm
    tm += STABLE / 2
    expect(a, tm, 30, 41, 40, 41, ebc(1, 98, 41, 40))
    assert a.panic_time == T0  # panic time does not move: 41/40 < 2
    tm += STABLE / 2 + 2
    expect(a, tm, 50, 56, 55, 50, ebc(1, 98, 56, 55))
    assert a.panic_time is None


def test_extend_panic_window() -> None:
    # TestAutoscalerExtendPanicWindow
    a = Autoscaler(spec(1, 98))
    expect(a, T0, 11, 25, 10, 25, ebc(1, 98, 25, 10))
    assert a.panic_time == T0
    tm = T0 + STABLE / 2
    expect(a, tm, 30, 80, 40, 80, ebc(1, 98, 80, 40))
    assert a.panic_time == tm


def test_stable_mode_decrease() -> None:
    # TestAutoscalerStableModeDecrease
    a = Autoscaler(spec(10, 98))
    expect(a, T0, 100, 100, 8, 10, ebc(10, 98, 100, 8))
    expect(a, T0, 50, 50, 8, 5, ebc(10, 98, 50, 8))


def test_stable_mode_no_traffic_scale_to_zero() -> None:
    # TestAutoscalerStableModeNoTrafficScaleToZero
    a = Autoscaler(spec(10, 75))
    expect(a, T0, 1, 0, 1, 1, ebc(10, 75, 0, 1))
    expect(a, T0, 0, 0, 1, 0, ebc(10, 75, 0, 1))


def test_activation_scale() -> None:
    # TestAutoscalerActivationScale
    a = Autoscaler(spec(10, 75, activation_scale=2))
    expect(a, T0, 0, 0, 1, 0, ebc(10, 75, 0, 1))
    expect(a, T0, 1, 0, 1, 2, ebc(10, 75, 0, 1))


def test_panic_mode_exponential_track_and_stabilize() -> None:
    # TestAutoscalerPanicModeExponentialTrackAndStabilize: 6 -> 36 -> 216 -> 1296
    a = Autoscaler(spec(1, 101))
    expect(a, T0, 6, 6, 1, 6, ebc(1, 101, 6, 1))
    tm = T0 + 1
    expect(a, tm, 36, 36, 6, 36, ebc(1, 101, 36, 6))
    assert a.panic_time == tm
    tm += 1
    expect(a, tm, 216, 216, 36, 216, ebc(1, 101, 216, 36))
    assert a.panic_time == tm
    expect(a, tm, 1296, 1296, 216, 1296, ebc(1, 101, 1296, 216))
    assert a.panic_time == tm
    expect(a, tm + 1, 1296, 1296, 1296, 1296, ebc(1, 101, 1296, 1296))


def test_panic_then_unpanic_scale_down() -> None:
    # TestAutoscalerPanicThenUnPanicScaleDown
    a = Autoscaler(spec(10, 93))
    expect(a, T0, 100, 100, 1, 10, ebc(10, 93, 100, 1))
    panic_t = T0 + 0.001
    expect(a, panic_t, 100, 1000, 10, 100, ebc(10, 93, 1000, 10))
    expect(a, panic_t + 30, 1, 1, 10, 100, ebc(10, 93, 1, 10))  # still panicking: no scale-down
    expect(a, panic_t + 61, 1, 1, 10, 1, ebc(10, 93, 1, 10))  # a stable window later: down


def test_rate_limit_scale_up() -> None:
    # TestAutoscalerRateLimitScaleUp
    a = Autoscaler(spec(10, 61))
    expect(a, T0, 1000, 1001, 1, 10, ebc(10, 61, 1001, 1))
    expect(a, T0, 1000, 1001, 10, 100, ebc(10, 61, 1001, 10))


def test_rate_limit_scale_down() -> None:
    # TestAutoscalerRateLimitScaleDown
    a = Autoscaler(spec(10, 61))
    expect(a, T0, 1, 1, 100, 10, ebc(10, 61, 1, 100))
    expect(a, T0, 1, 1, 10, 1, ebc(10, 61, 1, 10))


def test_use_one_pod_as_minimum_if_endpoints_not_found() -> None:
    # TestAutoscalerUseOnePodAsMinimumIfEndpointsNotFound
    expect(Autoscaler(spec(10, 81)), T0, 1000, 888, 0, 10, ebc(10, 81, 888, 0))


def test_update_target() -> None:
    # TestAutoscalerUpdateTarget
    a = Autoscaler(spec(10, 77))
    expect(a, T0, 100, 101, 1, 10, ebc(10, 77, 101, 1))
    a.update(DeciderSpec(target_value=1, total_value=1 / TU, target_burst_capacity=71, panic_threshold=2,
                         max_scale_down_rate=10, max_scale_up_rate=10, stable_window=STABLE,
                         activator_capacity=21))  # fmt: skip
    expect(a, T0, 100, 101, 10, 100, ebc(1, 71, 101, 10))


def test_no_data_no_autoscale() -> None:
    # TestAutoscalerNoDataNoAutoscale: no metrics -> invalid result, nothing applied
    assert not Autoscaler(spec(10, 100)).scale(T0, None, None, 1).scale_valid


def _delay_spec(reachable: bool = True) -> DeciderSpec:
    return DeciderSpec(
        target_value=10,
        total_value=0,
        target_burst_capacity=0,
        panic_threshold=100,
        max_scale_down_rate=10,
        max_scale_up_rate=10,
        scale_down_delay=300,
        reachable=reachable,
        stable_window=0,
    )


def test_scale_down_delay() -> None:
    # TestAutoscalerScaleDownDelay ("simple" then "gradual", same autoscaler, zero pods ready)
    a = Autoscaler(_delay_spec())
    assert a.scale(2, 40, 40, 0).desired_pod_count == 4
    assert a.scale(300, 0, 0, 0).desired_pod_count == 4  # 5 min at lower load: not yet
    assert a.scale(302, 0, 0, 0).desired_pod_count == 0  # 5 min 2 s: now
    assert a.scale(540, 40, 40, 0).desired_pod_count == 4
    assert a.scale(600, 30, 30, 0).desired_pod_count == 4  # 4 still dominates
    assert a.scale(660, 0, 0, 0).desired_pod_count == 4
    assert a.scale(840, 0, 0, 0).desired_pod_count == 3  # 4 scrolls out
    assert a.scale(900, 0, 0, 0).desired_pod_count == 0


def test_scale_down_delay_not_reachable() -> None:
    # TestAutoscalerScaleDownDelayNotReachable
    a = Autoscaler(_delay_spec())
    assert a.scale(2, 40, 40, 0).desired_pod_count == 4
    assert a.scale(60, 0, 0, 0).desired_pod_count == 4
    a.update(_delay_spec(reachable=False))
    assert a.scale(2, 0, 0, 0).desired_pod_count == 0


def test_scale_down_delay_zero() -> None:
    # TestAutoscalerScaleDownDelayZero: no window at all, so a decision in the same bucket applies
    s = _delay_spec()
    s.scale_down_delay = 0
    a = Autoscaler(s)
    assert a.scale(0, 40, 40, 0).desired_pod_count == 4
    assert a.scale(0.5, 20, 20, 0).desired_pod_count == 2


def test_start_in_panic_mode() -> None:
    # TestStartInPanicMode: 0 or 1 ready -> normal; 2 ready -> panicking with maxPanicPods = 2
    s = DeciderSpec(target_value=100, total_value=120, target_burst_capacity=11, panic_threshold=220,
                    max_scale_up_rate=10, max_scale_down_rate=10, stable_window=STABLE)  # fmt: skip
    for i in range(2):
        a = Autoscaler(s, ready_pods=i, now=T0)
        assert a.panic_time is None and a.max_panic_pods == i
    a = Autoscaler(s, ready_pods=2, now=T0)
    assert a.panic_time is not None and a.max_panic_pods == 2


def test_decider_initial_ebc_and_poke() -> None:
    # multiscaler.createScaler: EBC starts at initialScale*total - tbc; Poke only at desired 0.
    d = Decider(spec(10, 100, initial_scale=1))
    assert d.desired_scale == -1 and d.excess_burst_capacity == int(10 / TU - 100)
    assert not d.should_poke(1.0)
    d.desired_scale = 0
    assert d.should_poke(1.0) and not d.should_poke(0.0)


def test_num_activators() -> None:
    # computeNumActivators: max(2, ceil((ready*total + tbc) / activator capacity))
    s = spec(10, 211, total_value=100.0, activator_capacity=100.0)
    assert num_activators(0, s) == 3 and num_activators(10, s) == 13
    s.target_burst_capacity = 0
    assert num_activators(10, s) == 2


def _pa(**kw: float) -> PodAutoscaler:
    return PodAutoscaler(ScalerConfig(**kw))  # type: ignore[arg-type]


def test_pa_scale_to_zero_sequence() -> None:
    """Active -> held at 1 until active a stable window -> inactive (activator in path) -> zero after
    the grace period; with a retention period, zero only after retention."""
    for retention, zero_at in ((0.0, 100.0), (90.0, 160.0)):
        pa = _pa(scale_to_zero_pod_retention_period=retention)
        pa.state, pa.state_since, pa.replicas, pa.scale_target_initialized = PAState.ACTIVE, 0.0, 1, True
        pa.proxy_mode = False
        d = Decider(spec(10, 0))
        d.desired_scale, d.excess_burst_capacity = 0, 0
        assert pa.reconcile(30, d, 1) == 1 and pa.state == PAState.ACTIVE  # active < stable window
        assert pa.reconcile(70, d, 1) == 1 and pa.state == PAState.INACTIVE and pa.proxy_mode
        t = 70.0
        while pa.reconcile(t, d, 1) != 0:
            t += 2
            assert t < 400
        assert t == zero_at, retention


def test_pa_activation_and_serve_mode() -> None:
    pa = _pa()
    pa.state, pa.state_since, pa.replicas, pa.scale_target_initialized = PAState.INACTIVE, 0.0, 0, True
    d = Decider(spec(10, 0))
    d.desired_scale, d.excess_burst_capacity = 1, 0
    assert pa.reconcile(100, d, 0) == 1 and pa.state == PAState.ACTIVATING
    assert pa.reconcile(160, d, 1) == 1 and pa.state == PAState.ACTIVE
    assert not pa.proxy_mode  # TBC 0: activator leaves once a pod is wanted
    d.excess_burst_capacity = -5
    pa.reconcile(162, d, 1)
    assert pa.proxy_mode  # negative EBC: the activator comes back into the path


def test_pa_activation_timeout() -> None:
    # Stuck activating longer than progress-deadline + 30 s: scale to zero (kpa/scaler.go).
    pa = _pa(progress_deadline=600)
    pa.state, pa.state_since, pa.replicas = PAState.ACTIVATING, 0.0, 1
    d = Decider(spec(10, 0))
    d.desired_scale = 0
    assert pa.reconcile(629, d, 0) == 1
    assert pa.reconcile(630, d, 0) == 0 and pa.state == PAState.INACTIVE


def test_pa_bounds_and_initial_scale() -> None:
    pa = _pa(min_scale=1, max_scale=3, initial_scale=2)
    d = Decider(spec(10, 0))
    d.desired_scale = 10
    assert pa.reconcile(0, d, 0) == 3
    d.desired_scale = 0
    assert pa.reconcile(2, d, 0) == 2  # initial scale holds until the target was reached once
    pa.reconcile(4, d, 2)
    assert pa.scale_target_initialized
    assert pa.reconcile(6, d, 2) == 1  # then min-scale
