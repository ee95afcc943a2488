"""Knative's KPA decider and its scale-to-zero reconciler, in Python.

- `Autoscaler.scale` follows `pkg/autoscaler/scaling/autoscaler.go` (panic entry/exit, max panic pods,
  rate limits, activation scale, scale-down-delay window, excess burst capacity), so it can be checked
  row by row against Knative's `autoscaler_test.go` (see tests/serverless/test_kpa.py).
- `Decider` is the per-revision runner of `multiscaler.go`: latest desired scale, the 2 s tick and the
  immediate `poke` when a stat arrives while the revision is at zero.
- `PodAutoscaler` follows `pkg/reconciler/autoscaling/kpa/{kpa,scaler}.go`: min/max/initial scale,
  Active/Activating/Inactive, the grace period, pod retention and activation timeout before zero, and
  whether the activator is in the request path (SKS Proxy vs Serve mode).

Durations are float seconds; `now` is a float second timestamp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from serverless.metrics import TICK_INTERVAL_S, MaxTimeWindow

# kpa/scaler.go: the Deployment may spend progress-deadline + this buffer activating before zero.
ACTIVATION_TIMEOUT_BUFFER_S = 30.0
MIN_ACTIVATORS = 2


@dataclass
class DeciderSpec:
    """Knative's `scaling.DeciderSpec`, snake_case. Values as `MakeDecider` resolves them."""

    target_value: float
    total_value: float
    target_burst_capacity: float = 211.0
    panic_threshold: float = 2.0  # a ratio: panic-threshold-percentage / 100
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    activation_scale: int = 0  # 0/1: unset
    stable_window: float = 60.0
    scale_down_delay: float = 0.0
    reachable: bool = True
    initial_scale: int = 1
    activator_capacity: float = 100.0
    scaling_metric: str = "concurrency"


@dataclass(frozen=True)
class ScaleResult:
    desired_pod_count: int
    excess_burst_capacity: int
    scale_valid: bool = True


INVALID_SCALE = ScaleResult(0, 0, False)


class Autoscaler:
    """One revision's decider. `scale()` is pure arithmetic on the windows' averages and ready pods."""

    def __init__(self, spec: DeciderSpec, ready_pods: int = 0, now: float = 0.0) -> None:
        self.spec = spec
        # Knative starts in panic mode when more than one pod is ready: a restarted autoscaler has no
        # metric history and would otherwise scale down on its first ticks.
        self.panic_time: float | None = now if ready_pods > 1 else None
        self.max_panic_pods = ready_pods
        # Created only with a delay; a one-bucket window is not quite "no delay" (two decisions in one
        # bucket would keep the larger).
        self.delay_window: MaxTimeWindow | None = (
            MaxTimeWindow(spec.scale_down_delay, TICK_INTERVAL_S) if spec.scale_down_delay > 0 else None
        )

    @property
    def in_panic(self) -> bool:
        return self.panic_time is not None

    def update(self, spec: DeciderSpec) -> None:
        self.spec = spec

    def scale(
        self,
        now: float,
        stable_concurrency: float | None,
        panic_concurrency: float | None,
        ready_pods: int,
    ) -> ScaleResult:
        """Desired pods and excess burst capacity; `None` metrics (no data yet) give an invalid result."""
        spec = self.spec
        if stable_concurrency is None or panic_concurrency is None:
            return INVALID_SCALE
        ready = max(1.0, float(ready_pods))  # at zero pods, rates apply as if one were there

        # Ceil/floor so that a small rate still moves by at least one pod.
        max_scale_up = math.ceil(spec.max_scale_up_rate * ready)
        max_scale_down = math.floor(ready / spec.max_scale_down_rate) if spec.reachable else 0.0

        dspc = math.ceil(stable_concurrency / spec.target_value)
        dppc = math.ceil(panic_concurrency / spec.target_value)
        stable_pods = int(min(max(dspc, max_scale_down), max_scale_up))
        panic_pods = int(min(max(dppc, max_scale_down), max_scale_up))

        if spec.activation_scale > 1:
            # Coming from zero, go straight to activation-scale pods, never fewer while there is load.
            if dspc > 0 and spec.activation_scale > stable_pods:
                stable_pods = spec.activation_scale
            if dppc > 0 and spec.activation_scale > panic_pods:
                panic_pods = spec.activation_scale

        over_threshold = dppc / ready >= spec.panic_threshold
        if self.panic_time is None and over_threshold:
            self.panic_time = now
        elif over_threshold:
            self.panic_time = now  # still surging: extend the panic
        elif self.panic_time is not None and self.panic_time + spec.stable_window < now:
            # A whole stable window since the last over-threshold tick: the surge is in the stable average.
            self.panic_time = None
            self.max_panic_pods = 0

        desired = stable_pods
        if self.panic_time is not None:
            # Provision for whichever window sees more, and never scale down while panicking.
            desired = max(desired, panic_pods)
            self.max_panic_pods = max(self.max_panic_pods, desired)
            desired = self.max_panic_pods

        if spec.reachable and self.delay_window is not None:
            self.delay_window.record(now, desired)
            desired = self.delay_window.current()

        # EBC uses the panic value so the activator isn't pulled in/out on a whim; negative means the
        # ready pods can't absorb a burst of target-burst-capacity on top of current load.
        if spec.target_burst_capacity == 0:
            ebc = 0.0
        elif spec.target_burst_capacity > 0:
            ebc = math.floor(ready_pods * spec.total_value - spec.target_burst_capacity - panic_concurrency)
        else:
            ebc = -1.0
        return ScaleResult(int(desired), int(ebc), True)


class Decider:
    """`scalerRunner` + `MultiScaler.tickScaler/Poke`: keeps the latest valid decision for the PA."""

    def __init__(self, spec: DeciderSpec, ready_pods: int = 0, now: float = 0.0) -> None:
        self.autoscaler = Autoscaler(spec, ready_pods, now)
        self.desired_scale = -1  # -1 until the first valid decision
        tbc = spec.target_burst_capacity
        self.excess_burst_capacity = (
            int(tbc) if tbc in (-1, 0) else int(spec.initial_scale * spec.total_value - tbc)
        )

    @property
    def spec(self) -> DeciderSpec:
        return self.autoscaler.spec

    def tick(self, now: float, stable: float | None, panic: float | None, ready_pods: int) -> bool:
        """Run one decision; True when the PA should be reconciled (desired or EBC sign changed)."""
        result = self.autoscaler.scale(now, stable, panic, ready_pods)
        if not result.scale_valid:
            return False
        changed = result.desired_pod_count != self.desired_scale
        changed = changed or (result.excess_burst_capacity < 0) != (self.excess_burst_capacity < 0)
        self.desired_scale = result.desired_pod_count
        self.excess_burst_capacity = result.excess_burst_capacity
        return changed

    def should_poke(self, concurrency: float) -> bool:
        """Knative ticks out of schedule only when the revision is at zero and load appears."""
        return self.desired_scale == 0 and concurrency != 0


class PAState(Enum):
    ACTIVATING = "activating"  # Active=Unknown
    ACTIVE = "active"
    INACTIVE = "inactive"


@dataclass
class ScalerConfig:
    """The reconciler-side settings (PA annotations and config-autoscaler)."""

    min_scale: int = 0
    max_scale: int = 0  # 0: unlimited
    initial_scale: int = 1
    enable_scale_to_zero: bool = True
    scale_to_zero_grace_period: float = 30.0
    scale_to_zero_pod_retention_period: float = 0.0
    stable_window: float = 60.0
    target_burst_capacity: float = 211.0
    progress_deadline: float = 600.0
    reachable: bool = True


@dataclass
class PodAutoscaler:
    """The KPA reconciler's state machine for one revision.

    `reconcile()` is what Knative runs on every decider change, pod change and re-enqueue timer; the
    simulation calls it on each decider tick and pod event, so timers resolve to within one tick.
    """

    config: ScalerConfig
    state: PAState = PAState.ACTIVATING
    state_since: float = 0.0
    scale_target_initialized: bool = False
    proxy_mode: bool = True  # SKS Proxy: the activator is in the request path
    proxy_since: float = 0.0
    replicas: int = 0  # what was last written to the Deployment
    history: list[tuple[float, str]] = field(default_factory=list)

    def _set_state(self, now: float, state: PAState) -> None:
        if state != self.state:
            self.state = state
            self.state_since = now  # condition LastTransitionTime
            self.history.append((now, state.value))

    def _set_proxy(self, now: float, proxy: bool) -> None:
        if proxy != self.proxy_mode:
            self.proxy_mode = proxy
            self.proxy_since = now

    def _min_ready(self) -> int:
        cfg = self.config
        if not self.scale_target_initialized:
            return max(cfg.min_scale, cfg.initial_scale)
        return max(cfg.min_scale, 1)

    def _handle_scale_to_zero(self, now: float, desired: int) -> tuple[int, bool]:
        """(scale, apply?) as `handleScaleToZero`."""
        cfg = self.config
        if desired != 0:
            return desired, True
        if not cfg.enable_scale_to_zero:
            return 1, True
        if self.state == PAState.ACTIVATING:
            # Stuck activating past the progress deadline (+buffer): give up and go to zero.
            if now - self.state_since >= cfg.progress_deadline + ACTIVATION_TIMEOUT_BUFFER_S:
                return desired, True
            return -1, False
        if self.state == PAState.ACTIVE:
            # Hold one pod until the PA has been active a full stable window, then mark it inactive
            # (which puts the activator in the path) without scaling yet.
            if now - self.state_since >= cfg.stable_window:
                return desired, False
            return 1, True
        # Inactive. The activator probe succeeds once the SKS is proxying (instant in the simulation).
        if not self.proxy_mode:
            return desired, False
        retention = cfg.scale_to_zero_pod_retention_period if cfg.reachable else 0.0
        inactive_for = now - self.state_since
        if inactive_for >= max(cfg.scale_to_zero_grace_period, retention):
            return desired, True
        if retention > 0 and inactive_for < retention:
            return desired, False
        if cfg.scale_to_zero_grace_period - (now - self.proxy_since) <= 0:
            return desired, True
        return desired, False

    def _scale(self, now: float, desired: int) -> tuple[int, bool]:
        cfg = self.config
        if desired < 0 and self.state != PAState.ACTIVATING:
            return desired, False  # no metrics yet
        min_scale = cfg.min_scale
        if cfg.initial_scale > 1 and not self.scale_target_initialized and cfg.reachable:
            min_scale = max(cfg.initial_scale, min_scale)
        bounded = max(desired, min_scale)
        if cfg.max_scale != 0:
            bounded = min(bounded, cfg.max_scale)
        return self._handle_scale_to_zero(now, bounded)

    def reconcile(self, now: float, decider: Decider, ready_pods: int) -> int:
        """Returns the Deployment's replicas after this pass (unchanged when nothing was applied)."""
        want, apply = self._scale(now, decider.desired_scale)
        if apply and want >= 0:
            self.replicas = want
        # Serve mode (activator out of the path) only when pods are wanted and bursts fit in them.
        proxy = True
        if want == -1 and self.state == PAState.INACTIVE:
            proxy = True
        elif want > 0 and decider.excess_burst_capacity >= 0:
            proxy = False
        self._set_proxy(now, proxy)
        self._compute_active(now, want, ready_pods)
        return self.replicas

    def _compute_active(self, now: float, want: int, ready: int) -> None:
        min_ready = self._min_ready()
        if ready >= min_ready:
            self.scale_target_initialized = True
        if want == 0 or min_ready == 0:
            self._set_state(now, PAState.INACTIVE)
        elif ready < min_ready:
            if want > 0 or self.state != PAState.INACTIVE:
                self._set_state(now, PAState.ACTIVATING)
            else:
                self._set_state(now, PAState.INACTIVE)
        elif want > 0 or self.state != PAState.INACTIVE:
            self._set_state(now, PAState.ACTIVE)


def num_activators(ready_pods: int, spec: DeciderSpec) -> int:
    """`computeNumActivators`: how many activators share the revision's traffic (for reporting)."""
    if spec.target_burst_capacity == 0:
        return MIN_ACTIVATORS
    cover = ready_pods * spec.total_value
    if spec.target_burst_capacity > 0:
        cover += spec.target_burst_capacity
    return max(MIN_ACTIVATORS, math.ceil(cover / spec.activator_capacity))
