"""Discrete-event simulation of one tenant: semantic-cache transformer -> activator -> KPA-scaled vLLM pods.

What is modelled, and where it comes from:
- Requests hit the transformer first; cache hits are answered there (`cache_hit_latency_s`) and never
  reach the predictor, so a dev tenant can serve hits while the predictor sits at zero.
- Misses go to the activator while it is in the path (SKS Proxy mode, or no ready pod). It holds them
  (bounded queue, 503 when full) until a pod has room (`containerConcurrency`; unlimited when 0) or the
  revision timeout passes (503). Otherwise misses go straight to the least-loaded ready pod, whose
  queue-proxy queues up to 10×containerConcurrency.
- Pods start after a drawn startup delay, run at most min(containerConcurrency, max_num_seqs) requests,
  and decode with the profile's batch-aware throughput: with n running, each gets T(n)/n tokens/s after
  a prefill of ttft(n). Terminated pods stop taking requests and drain what they hold.
- Every second the revision's average concurrency (or request count) is recorded into the stable and
  panic windows; the decider ticks every 2 s and at once (poke) when the activator reports a first
  request while the revision is at zero. The PodAutoscaler reconciler (scale to zero, min/max/initial
  scale, activator in/out of the path) runs after each tick and pod change.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, replace

from serverless.activator import Activator
from serverless.events import EPS, ConcurrencyMeter, EventKind, EventQueue
from serverless.kpa import Decider, DeciderSpec, PAState, PodAutoscaler
from serverless.metrics import SCRAPE_INTERVAL_S, TICK_INTERVAL_S, Stat
from serverless.pod_profile import EngineProfile
from serverless.pods import Pod, ReplicaSet, Request, RequestState
from serverless.sim_report import SERIES_KEYS, RunStats, SimResult, summarize
from serverless.sim_settings import SimSettings
from serverless.traffic import Arrival

START_MODES = ("deploy", "idle", "warm")


@dataclass(frozen=True)
class RunOptions:
    """How one run goes, apart from the deployment (SimSettings), the pods (EngineProfile) and the traffic."""

    duration: float
    seed: int = 0
    hit_ratio: float = 0.0  # share of requests the cache answers (a trace's `hit` column wins)
    output_tokens: int = 128  # per predictor request (a trace's column wins)
    start: str = "deploy"  # one of START_MODES
    cache_hit_latency_s: float = 0.02
    transformer_overhead_s: float = 0.01  # what a miss adds on its way through the transformer
    record_series: bool = True

    def __post_init__(self) -> None:
        if self.start not in START_MODES:
            raise ValueError(f"start: {self.start!r} is not one of {START_MODES}")
        if not 0.0 <= self.hit_ratio <= 1.0:
            raise ValueError(f"hit_ratio: {self.hit_ratio} is outside [0, 1]")
        if self.output_tokens < 1:
            raise ValueError("output_tokens: must be >= 1")


class Simulation:
    """Wires the parts (events, pods, activator, metrics, decider, PodAutoscaler) and runs them."""

    def __init__(
        self, settings: SimSettings, profile: EngineProfile, arrivals: list[Arrival], options: RunOptions
    ) -> None:
        self.s, self.profile, self.arrivals, self.options = settings, profile, arrivals, options
        self.duration = options.duration
        # Separate streams so that, e.g., a different hit ratio does not reshuffle startup delays.
        self.rng_hits = random.Random(f"{options.seed}:hits")
        rng_startup = random.Random(f"{options.seed}:startup")
        self.events = EventQueue()
        self.load = ConcurrencyMeter()
        cc = settings.container_concurrency
        self.replicas = ReplicaSet(profile, cc, self.events, rng_startup, on_done=self._request_done)
        self.activator = Activator(settings.activator_queue_depth, cc, self.replicas)
        self.requests: list[Request] = []
        self._rps_count = 0  # predictor requests since the last scrape
        self.stats = RunStats()
        self.cold_episode_start: float | None = None
        self.series: dict[str, list[float]] = {k: [] for k in SERIES_KEYS}
        self._last_stable: float | None = None
        self._last_panic: float | None = None
        self.collector = settings.metric_collector()
        self.pa = PodAutoscaler(settings.scaler_config())
        self.decider = self._start_state(settings.decider_spec())

    @property
    def now(self) -> float:
        return self.events.now

    @property
    def pods(self) -> list[Pod]:
        return self.replicas.pods

    def _start_state(self, spec: DeciderSpec) -> Decider:
        s = self.s
        if self.options.start == "deploy":
            # As after `kubectl apply`: the Deployment starts at initial-scale, the PA is activating and the
            # decider has no metrics yet.
            self.pa.state, self.pa.state_since = PAState.ACTIVATING, 0.0
            self.pa.replicas = s.initial_scale
            self.replicas.scale_to(s.initial_scale)
            return Decider(spec, 0, 0.0)
        n = s.min_scale if self.options.start == "idle" else max(s.min_scale, 1)
        for _ in range(n):
            self.replicas.add(ready_at=0.0, ready=True)
        decider = Decider(spec, n, 0.0)
        decider.desired_scale = n
        tbc = spec.target_burst_capacity
        decider.excess_burst_capacity = int(tbc) if tbc in (-1, 0) else math.floor(n * spec.total_value - tbc)
        self.pa.scale_target_initialized = True
        self.pa.replicas = n
        # Long-settled: active (or inactive at zero) for more than any window already.
        self.pa.state = PAState.ACTIVE if n > 0 else PAState.INACTIVE
        self.pa.state_since = -max(s.stable_window, s.scale_to_zero_grace_period) - 1
        self.pa.proxy_mode = not (n > 0 and decider.excess_burst_capacity >= 0)
        self.pa.proxy_since = self.pa.state_since
        return decider

    # --- request path --------------------------------------------------------------------------

    def _activator_in_path(self) -> bool:
        return self.pa.proxy_mode or self.replicas.ready_count() == 0

    def _request_done(self, req: Request) -> None:
        self.load.remove(self.now)

    def _fail(self, req: Request, state: RequestState) -> None:
        self.load.remove(self.now)
        req.state = state

    def _forward(self, pod: Pod, req: Request) -> None:
        if not self.replicas.send(pod, req):
            self._fail(req, RequestState.REJECTED)

    def _release_held(self) -> None:
        self.activator.release(self._forward)

    def _arrive(self, a: Arrival, idx: int) -> None:
        hit = a.hit if a.hit is not None else (self.rng_hits.random() < self.options.hit_ratio)
        output_tokens = a.output_tokens or self.options.output_tokens
        req = Request(idx, self.now, hit, output_tokens, deadline=self.now + self.s.timeout_s)
        self.requests.append(req)
        if hit:
            req.state, req.done = RequestState.DONE, self.now + self.options.cache_hit_latency_s
            return
        self.load.add(self.now)
        self._rps_count += 1
        self.events.push(req.deadline, EventKind.DEADLINE, req)
        req.cold = self.replicas.ready_count() == 0
        if req.cold and self.cold_episode_start is None:
            self.cold_episode_start = self.now
            self.stats.cold_starts += 1
        if not self._activator_in_path():
            self._forward(self.replicas.least_loaded(), req)
            return
        if self.activator.note_request():
            # The activator reports a revision's first request at once (concurrency 1) and the
            # autoscaler pokes the decider if the revision is at zero: that is what starts a pod.
            self.collector.record(self.now, Stat(concurrency=1.0, requests=1.0))
            if self.decider.should_poke(1.0):
                self._tick()
        pod = self.activator.target()
        if pod is not None and not self.activator.held:
            self._forward(pod, req)
        elif not self.activator.hold(req):
            self._fail(req, RequestState.REJECTED)

    def _deadline(self, req: Request) -> None:
        if req.state == RequestState.HELD:
            self.activator.expire(req)
            self._fail(req, RequestState.TIMED_OUT)
        elif req.state == RequestState.QUEUED:
            self.replicas.unqueue(req)
            self._fail(req, RequestState.TIMED_OUT)

    def _pod_ready(self, pod: Pod) -> None:
        if not self.replicas.mark_ready(pod):
            return
        if self.cold_episode_start is not None:
            self.stats.cold_waits.append(self.now - self.cold_episode_start)
            self.cold_episode_start = None
        self._reconcile()  # a pod count change wakes the PA reconciler
        self._release_held()

    def _pod_event(self, pod: Pod, version: int) -> None:
        if self.replicas.on_event(pod, version):
            self._release_held()

    # --- autoscaling ---------------------------------------------------------------------------

    def _scrape(self) -> None:
        avg = self.load.average_since_last_report(self.now)
        rps = float(self._rps_count)
        self._rps_count = 0
        report = self.activator.end_interval()
        if self.replicas.ready_count() > 0 or report.active:
            # Subtract the first-request report already recorded so that request counts once.
            adjust = report.first_request_adjust
            stat = Stat(concurrency=max(0.0, avg - adjust), requests=max(0.0, rps - adjust))
            self.collector.record(self.now, stat)
        self._sample()

    def _tick(self) -> None:
        if self.s.metric == "rps":
            values = self.collector.stable_and_panic_rps(self.now)
        else:
            values = self.collector.stable_and_panic_concurrency(self.now)
        stable, panic = values if values is not None else (None, None)
        was_panic = self.decider.autoscaler.in_panic
        self.decider.tick(self.now, stable, panic, self.replicas.ready_count())
        if was_panic:
            self.stats.panic_seconds += TICK_INTERVAL_S
        self._last_stable, self._last_panic = stable, panic
        self._reconcile()

    def _reconcile(self) -> None:
        replicas = self.pa.reconcile(self.now, self.decider, self.replicas.ready_count())
        self.replicas.scale_to(replicas)
        self._release_held()

    def _sample(self) -> None:
        ready = self.replicas.ready_count()
        self.stats.peak_ready = max(self.stats.peak_ready, ready)
        existing = self.replicas.existing_count()
        if existing == 0:
            self.stats.time_at_zero += SCRAPE_INTERVAL_S
        if not self.options.record_series:
            return
        row = {
            "t": self.now,
            "in_flight": self.load.count,
            "activator_queue": self.activator.held_live,
            "pods_desired": self.pa.replicas,
            "pods_ready": ready,
            "pods_total": existing,
            "decider_desired": self.decider.desired_scale,
            "panic": 1.0 if self.decider.autoscaler.in_panic else 0.0,
            "excess_burst_capacity": self.decider.excess_burst_capacity,
            "activator_in_path": 1.0 if self._activator_in_path() else 0.0,
            "stable_concurrency": self._last_stable or 0.0,
            "panic_concurrency": self._last_panic or 0.0,
        }
        for key, value in row.items():
            self.series[key].append(value)

    # --- run -----------------------------------------------------------------------------------

    def run(self) -> SimResult:
        for i, a in enumerate(self.arrivals):
            if a.t < self.duration:
                self.events.push(a.t, EventKind.ARRIVE, (a, i))
        self.events.every(SCRAPE_INTERVAL_S, EventKind.SCRAPE, self.duration)
        self.events.every(TICK_INTERVAL_S, EventKind.TICK, self.duration)
        if self.options.start != "deploy":
            self._reconcile()
        handlers = {
            EventKind.ARRIVE: lambda p: self._arrive(*p),
            EventKind.POD: lambda p: self._pod_event(*p),
            EventKind.POD_READY: self._pod_ready,
            EventKind.DEADLINE: self._deadline,
            EventKind.SCRAPE: lambda _: self._scrape(),
            EventKind.TICK: lambda _: self._tick(),
        }
        while self.events:
            t, kind, payload = self.events.pop()
            if t > self.duration + EPS:
                break
            self.events.now = t
            handlers[kind](payload)
        self.events.now = self.duration
        return self._result()

    def gpu_seconds(self) -> float:
        return self.s.gpus_per_pod * self.replicas.pod_seconds(self.duration)

    def _result(self) -> SimResult:
        self.stats.peak_pods = self.replicas.peak
        self.stats.pods_created = len(self.replicas.pods)
        self.stats.gpu_seconds = self.gpu_seconds()
        summary, latencies = summarize(
            self.requests, self.stats, self.duration, self.options.transformer_overhead_s
        )
        return SimResult(summary, self.series, latencies, self.s.to_dict(), self.profile.to_dict())


def simulate(
    settings: SimSettings,
    profile: EngineProfile,
    arrivals: list[Arrival],
    options: RunOptions,
    *,
    baselines: bool = True,
) -> SimResult:
    """Run the tenant, and (with `baselines`) the same traffic without the cache and without
    scale-to-zero, to report the GPU-seconds each one saves."""
    result = Simulation(settings, profile, arrivals, options).run()
    gpu = result.summary["gpu_seconds"]
    saved_cache: float | None = None
    saved_stz: float | None = None
    if baselines:
        quiet = replace(options, record_series=False)
        if result.summary["cache_hits"] > 0:
            no_cache = [Arrival(a.t, a.prompt_id, a.tenant, False, a.output_tokens) for a in arrivals]
            base = Simulation(settings, profile, no_cache, replace(quiet, hit_ratio=0.0)).run()
            saved_cache = base.summary["gpu_seconds"] - gpu
        else:
            saved_cache = 0.0
        if settings.min_scale == 0 and settings.enable_scale_to_zero:
            always_on = copy.deepcopy(settings)
            always_on.min_scale = 1
            if always_on.activation_scale and always_on.activation_scale < 1:
                always_on.activation_scale = 0
            base = Simulation(always_on, profile, arrivals, quiet).run()
            saved_stz = base.summary["gpu_seconds"] - gpu
        else:
            saved_stz = 0.0
    result.summary["gpu_seconds_saved_by_cache"] = saved_cache
    result.summary["gpu_seconds_saved_by_scale_to_zero"] = saved_stz
    return result
