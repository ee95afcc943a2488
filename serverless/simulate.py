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
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

from serverless.engine import EngineProfile
from serverless.kpa import Decider, PAState, PodAutoscaler
from serverless.metrics import SCRAPE_INTERVAL_S, TICK_INTERVAL_S, MetricCollector, Stat
from serverless.settings_from_manifest import SimSettings
from serverless.traffic import Arrival

_EPS = 1e-9
START_MODES = ("deploy", "idle", "warm")


@dataclass
class Request:
    id: int
    arrival: float
    hit: bool
    output_tokens: int
    deadline: float
    state: str = "new"  # held | queued | prefill | decode | done | timed_out | rejected
    remaining: float = 0.0
    prefill_end: float = 0.0
    first_token: float | None = None
    done: float | None = None
    cold: bool = False  # arrived while no predictor pod was ready


@dataclass
class Pod:
    id: int
    created: float
    ready_at: float
    ready: bool = False
    terminating: bool = False
    gone_at: float | None = None
    running: list[Request] = field(default_factory=list)
    queue: deque[Request] = field(default_factory=deque)
    queued: int = 0  # live entries in `queue` (timed-out ones are skipped lazily)
    last_update: float = 0.0
    version: int = 0

    @property
    def load(self) -> int:
        return len(self.running) + self.queued

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating and self.gone_at is None


@dataclass
class SimResult:
    summary: dict[str, Any]
    series: dict[str, list[float]]
    latencies: list[tuple[float, float, bool]]  # (completion time, latency, was a cache hit)
    settings: dict[str, Any]
    profile: dict[str, Any]


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Simulation:
    def __init__(
        self,
        settings: SimSettings,
        profile: EngineProfile,
        arrivals: list[Arrival],
        *,
        duration: float,
        seed: int = 0,
        hit_ratio: float = 0.0,
        output_tokens: int = 128,
        start: str = "deploy",
        cache_hit_latency_s: float = 0.02,
        transformer_overhead_s: float = 0.01,
        record_series: bool = True,
    ) -> None:
        if start not in START_MODES:
            raise ValueError(f"start: {start!r} is not one of {START_MODES}")
        if not 0.0 <= hit_ratio <= 1.0:
            raise ValueError(f"hit_ratio: {hit_ratio} is outside [0, 1]")
        if output_tokens < 1:
            raise ValueError("output_tokens: must be >= 1")
        self.s = settings
        self.profile = profile
        self.arrivals = arrivals
        self.duration = duration
        self.seed = seed
        self.hit_ratio = hit_ratio
        self.output_tokens = output_tokens
        self.start = start
        self.cache_hit_latency_s = cache_hit_latency_s
        self.transformer_overhead_s = transformer_overhead_s
        self.record_series = record_series
        # Separate streams so that, e.g., a different hit ratio does not reshuffle startup delays.
        self.rng_hits = random.Random(f"{seed}:hits")
        self.rng_startup = random.Random(f"{seed}:startup")

        cc = settings.container_concurrency
        self.run_limit = min(cc, profile.max_num_seqs) if cc > 0 else profile.max_num_seqs
        self.pod_queue_limit = 10 * cc if cc > 0 else math.inf  # queue-proxy breaker depth

        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = count()
        self.now = 0.0
        self.pods: list[Pod] = []
        self._pod_ids = count()
        self.held: deque[Request] = deque()
        self.held_live = 0
        self.requests: list[Request] = []
        self.in_system = 0  # predictor-bound requests held or in pods
        self._area = 0.0
        self._area_t = 0.0
        self._area_at_scrape = 0.0
        self._last_scrape = 0.0
        self._rps_count = 0
        self._activator_busy_interval = False  # the activator saw requests since its last report
        self._activator_had_stat = (
            False  # Knative deletes an idle activator stat; the next request is "first"
        )
        self._first_request_adjust = 0.0
        self.cold_episode_start: float | None = None
        self.cold_waits: list[float] = []
        self.cold_starts = 0
        self.peak_pods = 0
        self.peak_ready = 0
        self.time_at_zero = 0.0
        self.panic_seconds = 0.0
        self.series: dict[str, list[float]] = {
            k: []
            for k in (
                "t", "in_flight", "activator_queue", "pods_desired", "pods_ready", "pods_total",
                "decider_desired", "panic", "excess_burst_capacity", "activator_in_path",
                "stable_concurrency", "panic_concurrency",
            )
        }  # fmt: skip

        spec = settings.decider_spec()
        self.collector = MetricCollector(
            settings.stable_window,
            settings.panic_window,
            settings.aggregation_algorithm,
            scrape_target=settings.target_burst_capacity != -1,
        )
        self.pa = PodAutoscaler(settings.scaler_config())
        self._init_state(spec)

    # --- setup ---------------------------------------------------------------------------------

    def _init_state(self, spec: Any) -> None:
        s = self.s
        if self.start == "deploy":
            # As after `kubectl apply`: the Deployment starts at initial-scale, the PA is activating and the
            # decider has no metrics yet.
            self.decider = Decider(spec, 0, 0.0)
            self.pa.state, self.pa.state_since = PAState.ACTIVATING, 0.0
            self.pa.replicas = s.initial_scale
            self._scale_deployment(s.initial_scale)
            return
        n = s.min_scale if self.start == "idle" else max(s.min_scale, 1)
        for _ in range(n):
            self._add_pod(ready_at=0.0, ready=True)
        self.decider = Decider(spec, n, 0.0)
        self.decider.desired_scale = n
        tbc = spec.target_burst_capacity
        self.decider.excess_burst_capacity = (
            int(tbc) if tbc in (-1, 0) else math.floor(n * spec.total_value - tbc)
        )
        self.pa.scale_target_initialized = True
        self.pa.replicas = n
        # Long-settled: active (or inactive at zero) for more than any window already.
        self.pa.state = PAState.ACTIVE if n > 0 else PAState.INACTIVE
        self.pa.state_since = -max(s.stable_window, s.scale_to_zero_grace_period) - 1
        self.pa.proxy_mode = not (n > 0 and self.decider.excess_burst_capacity >= 0)
        self.pa.proxy_since = self.pa.state_since

    # --- event plumbing ------------------------------------------------------------------------

    def _push(self, t: float, kind: str, obj: Any = None) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, obj))

    def _account(self) -> None:
        """Integrate revision concurrency up to now (for the per-second average the pods report)."""
        self._area += self.in_system * (self.now - self._area_t)
        self._area_t = self.now

    def _ready_count(self) -> int:
        return sum(1 for p in self.pods if p.serving)

    def _live_pods(self) -> list[Pod]:
        return [p for p in self.pods if p.gone_at is None and not p.terminating]

    # --- pods ----------------------------------------------------------------------------------

    def _add_pod(self, ready_at: float, ready: bool = False) -> Pod:
        pod = Pod(next(self._pod_ids), created=self.now, ready_at=ready_at, ready=ready, last_update=self.now)
        self.pods.append(pod)
        if not ready:
            self._push(ready_at, "pod_ready", pod)
        self.peak_pods = max(self.peak_pods, len(self._live_pods()))
        return pod

    def _scale_deployment(self, replicas: int) -> None:
        live = self._live_pods()
        if len(live) < replicas:
            for _ in range(replicas - len(live)):
                self._add_pod(self.now + self.profile.startup.draw(self.rng_startup))
        elif len(live) > replicas:
            # ReplicaSet deletion order: not-ready pods first, then the most recently ready.
            victims = sorted(live, key=lambda p: (p.ready, -p.ready_at, -p.id))[: len(live) - replicas]
            for pod in victims:
                self._terminate(pod)

    def _terminate(self, pod: Pod) -> None:
        pod.terminating = True
        if not pod.ready or pod.load == 0:
            pod.gone_at = self.now

    def _pod_ready(self, pod: Pod) -> None:
        if pod.gone_at is not None or pod.terminating:
            return
        pod.ready = True
        pod.last_update = self.now
        if self.cold_episode_start is not None:
            self.cold_waits.append(self.now - self.cold_episode_start)
            self.cold_episode_start = None
        self._reconcile()  # a pod count change wakes the PA reconciler
        self._dispatch_activator()

    def _advance(self, pod: Pod) -> None:
        dt = self.now - pod.last_update
        if dt > 0 and pod.running:
            rate = self.profile.per_request_tokens_per_s(len(pod.running))
            for r in pod.running:
                if r.state == "decode":
                    r.remaining -= rate * dt
        pod.last_update = self.now

    def _reschedule(self, pod: Pod) -> None:
        pod.version += 1
        if not pod.running:
            return
        rate = self.profile.per_request_tokens_per_s(len(pod.running))
        nxt = math.inf
        for r in pod.running:
            if r.state == "prefill":
                nxt = min(nxt, r.prefill_end)
            else:
                nxt = min(nxt, self.now + max(r.remaining, 0.0) / rate)
        self._push(max(nxt, self.now), "pod", (pod, pod.version))

    def _start(self, pod: Pod, req: Request) -> None:
        req.state = "prefill"
        req.prefill_end = self.now + self.profile.ttft(len(pod.running) + 1)
        req.remaining = float(req.output_tokens)
        pod.running.append(req)

    def _send_to_pod(self, pod: Pod, req: Request) -> bool:
        """False when the pod's queue-proxy queue is full (503)."""
        self._advance(pod)
        if len(pod.running) < self.run_limit:
            self._start(pod, req)
            self._reschedule(pod)
        else:
            if pod.queued >= self.pod_queue_limit:
                return False
            req.state = "queued"
            pod.queue.append(req)
            pod.queued += 1
        return True

    def _pod_event(self, pod: Pod, version: int) -> None:
        if version != pod.version:
            return
        self._advance(pod)
        finished = False
        for r in list(pod.running):
            if r.state == "prefill" and r.prefill_end <= self.now + _EPS:
                r.state = "decode"
                r.first_token = self.now
            elif r.state == "decode" and r.remaining <= 1e-6:
                self._account()
                r.state, r.done = "done", self.now
                pod.running.remove(r)
                self.in_system -= 1
                finished = True
        while pod.queue and len(pod.running) < self.run_limit:
            r = pod.queue.popleft()
            if r.state != "queued":
                continue  # timed out while queued
            pod.queued -= 1
            self._start(pod, r)
        self._reschedule(pod)
        if pod.terminating and pod.load == 0 and pod.gone_at is None:
            pod.gone_at = self.now
        if finished:
            self._dispatch_activator()

    # --- request path --------------------------------------------------------------------------

    def _activator_in_path(self) -> bool:
        return self.pa.proxy_mode or self._ready_count() == 0

    def _activator_target(self) -> Pod | None:
        cc = self.s.container_concurrency
        best: Pod | None = None
        for p in self.pods:
            if p.serving and (cc == 0 or p.load < cc) and (best is None or p.load < best.load):
                best = p
        return best

    def _dispatch_activator(self) -> None:
        while self.held:
            head = self.held[0]
            if head.state != "held":
                self.held.popleft()
                continue
            pod = self._activator_target()
            if pod is None:
                return
            self.held.popleft()
            self.held_live -= 1
            if not self._send_to_pod(pod, head):
                self._fail(head, "rejected")

    def _fail(self, req: Request, state: str) -> None:
        self._account()
        req.state = state
        self.in_system -= 1

    def _arrive(self, a: Arrival, idx: int) -> None:
        hit = a.hit if a.hit is not None else (self.rng_hits.random() < self.hit_ratio)
        req = Request(
            id=idx,
            arrival=self.now,
            hit=hit,
            output_tokens=a.output_tokens or self.output_tokens,
            deadline=self.now + self.s.timeout_s,
        )
        self.requests.append(req)
        if hit:
            req.state, req.done = "done", self.now + self.cache_hit_latency_s
            return
        self._account()
        self.in_system += 1
        self._rps_count += 1
        self._push(req.deadline, "deadline", req)
        ready = self._ready_count()
        req.cold = ready == 0
        if req.cold and self.cold_episode_start is None:
            self.cold_episode_start = self.now
            self.cold_starts += 1
        if self._activator_in_path():
            self._activator_busy_interval = True
            if not self._activator_had_stat:
                # The activator reports a revision's first request at once (concurrency 1) and the
                # autoscaler pokes the decider if the revision is at zero: that is what starts a pod.
                self._activator_had_stat = True
                self._first_request_adjust = 1.0
                self.collector.record(self.now, Stat(concurrency=1.0, requests=1.0))
                if self.decider.should_poke(1.0):
                    self._tick()
            pod = self._activator_target()
            if pod is not None and not self.held:
                if not self._send_to_pod(pod, req):
                    self._fail(req, "rejected")
                return
            if self.held_live >= self.s.activator_queue_depth:
                self._fail(req, "rejected")
                return
            req.state = "held"
            self.held.append(req)
            self.held_live += 1
            return
        pod = min((p for p in self.pods if p.serving), key=lambda p: p.load)
        if not self._send_to_pod(pod, req):
            self._fail(req, "rejected")

    def _deadline(self, req: Request) -> None:
        if req.state == "held":
            self.held_live -= 1
            self._fail(req, "timed_out")
        elif req.state == "queued":
            for p in self.pods:
                if req in p.queue:
                    p.queued -= 1
                    break
            self._fail(req, "timed_out")

    # --- autoscaling ---------------------------------------------------------------------------

    def _scrape(self) -> None:
        self._account()
        interval = self.now - self._last_scrape
        avg = (self._area - self._area_at_scrape) / interval if interval > 0 else float(self.in_system)
        self._area_at_scrape, self._last_scrape = self._area, self.now
        rps = float(self._rps_count)
        self._rps_count = 0
        ready = self._ready_count()
        activator_active = self._activator_busy_interval or self.held_live > 0
        if ready > 0 or activator_active:
            # Subtract the first-request report already recorded so that request counts once.
            conc = max(0.0, avg - self._first_request_adjust)
            self.collector.record(
                self.now, Stat(concurrency=conc, requests=max(0.0, rps - self._first_request_adjust))
            )
        self._first_request_adjust = 0.0
        self._activator_had_stat = activator_active
        self._activator_busy_interval = False
        self._sample()

    def _tick(self) -> None:
        if self.s.metric == "rps":
            values = self.collector.stable_and_panic_rps(self.now)
        else:
            values = self.collector.stable_and_panic_concurrency(self.now)
        stable, panic = values if values is not None else (None, None)
        was_panic = self.decider.autoscaler.in_panic
        self.decider.tick(self.now, stable, panic, self._ready_count())
        if was_panic:
            self.panic_seconds += TICK_INTERVAL_S
        self._last_stable, self._last_panic = stable, panic
        self._reconcile()

    def _reconcile(self) -> None:
        replicas = self.pa.reconcile(self.now, self.decider, self._ready_count())
        self._scale_deployment(replicas)
        self._dispatch_activator()

    def _sample(self) -> None:
        ready = self._ready_count()
        self.peak_ready = max(self.peak_ready, ready)
        existing = sum(1 for p in self.pods if p.gone_at is None)
        if existing == 0:
            self.time_at_zero += SCRAPE_INTERVAL_S
        if not self.record_series:
            return
        se = self.series
        se["t"].append(self.now)
        se["in_flight"].append(self.in_system)
        se["activator_queue"].append(self.held_live)
        se["pods_desired"].append(self.pa.replicas)
        se["pods_ready"].append(ready)
        se["pods_total"].append(existing)
        se["decider_desired"].append(self.decider.desired_scale)
        se["panic"].append(1.0 if self.decider.autoscaler.in_panic else 0.0)
        se["excess_burst_capacity"].append(self.decider.excess_burst_capacity)
        se["activator_in_path"].append(1.0 if self._activator_in_path() else 0.0)
        se["stable_concurrency"].append(getattr(self, "_last_stable", None) or 0.0)
        se["panic_concurrency"].append(getattr(self, "_last_panic", None) or 0.0)

    # --- run -----------------------------------------------------------------------------------

    def run(self) -> SimResult:
        for i, a in enumerate(self.arrivals):
            if a.t < self.duration:
                self._push(a.t, "arrive", (a, i))
        t = SCRAPE_INTERVAL_S
        while t <= self.duration + _EPS:
            self._push(t, "scrape")
            t += SCRAPE_INTERVAL_S
        t = TICK_INTERVAL_S
        while t <= self.duration + _EPS:
            self._push(t, "tick")
            t += TICK_INTERVAL_S
        if self.start != "deploy":
            self._reconcile()
        while self._events:
            t, _, kind, obj = heapq.heappop(self._events)
            if t > self.duration + _EPS:
                break
            self.now = t
            if kind == "arrive":
                self._arrive(*obj)
            elif kind == "pod":
                self._pod_event(*obj)
            elif kind == "pod_ready":
                self._pod_ready(obj)
            elif kind == "deadline":
                self._deadline(obj)
            elif kind == "scrape":
                self._scrape()
            elif kind == "tick":
                self._tick()
        self.now = self.duration
        return self._result()

    def gpu_seconds(self) -> float:
        end = self.duration
        return self.s.gpus_per_pod * sum(
            (min(p.gone_at, end) if p.gone_at is not None else end) - p.created for p in self.pods
        )

    def _result(self) -> SimResult:
        reqs = self.requests
        served = [r for r in reqs if r.state == "done" and r.done is not None]
        lat_all = [
            (r.done - r.arrival) + (0.0 if r.hit else self.transformer_overhead_s) for r in served if r.done
        ]
        lat_pred = [
            (r.done - r.arrival) + self.transformer_overhead_s for r in served if not r.hit and r.done
        ]
        ttft = [r.first_token - r.arrival + self.transformer_overhead_s for r in served if r.first_token]
        misses = [r for r in reqs if not r.hit]
        cold_ttft = [r.first_token - r.arrival + self.transformer_overhead_s
                     for r in misses if r.cold and r.first_token]
        summary: dict[str, Any] = {
            "requests": len(reqs),
            "cache_hits": sum(1 for r in reqs if r.hit),
            "predictor_requests": len(misses),
            "served": len(served),
            "timed_out": sum(1 for r in reqs if r.state == "timed_out"),
            "rejected": sum(1 for r in reqs if r.state == "rejected"),
            "unfinished": sum(1 for r in reqs if r.state in ("held", "queued", "prefill", "decode")),
            "latency_p50_s": percentile(lat_all, 50),
            "latency_p99_s": percentile(lat_all, 99),
            "predictor_latency_p50_s": percentile(lat_pred, 50),
            "predictor_latency_p99_s": percentile(lat_pred, 99),
            "ttft_p99_s": percentile(ttft, 99),
            "cold_starts": self.cold_starts,
            "cold_start_requests": sum(1 for r in misses if r.cold),
            "cold_start_wait_max_s": max(self.cold_waits) if self.cold_waits else None,
            # What a user who arrives after an idle spell waits for: the pod's start plus the first
            # token (profile startup phases + TTFT), request arrival to first token.
            "first_answer_after_idle_p50_s": percentile(cold_ttft, 50),
            "first_answer_after_idle_max_s": max(cold_ttft) if cold_ttft else None,
            "peak_pods": self.peak_pods,
            "peak_ready_pods": self.peak_ready,
            "pods_created": len(self.pods),
            "time_at_zero_s": self.time_at_zero,
            "panic_s": self.panic_seconds,
            "gpu_seconds": self.gpu_seconds(),
            "duration_s": self.duration,
        }
        latencies = [
            (r.done, (r.done - r.arrival) + (0.0 if r.hit else self.transformer_overhead_s), r.hit)
            for r in served
            if r.done is not None
        ]
        return SimResult(summary, self.series, latencies, self.s.to_dict(), self.profile.to_dict())


def simulate(
    settings: SimSettings,
    profile: EngineProfile,
    arrivals: list[Arrival],
    *,
    duration: float,
    seed: int = 0,
    hit_ratio: float = 0.0,
    output_tokens: int = 128,
    start: str = "deploy",
    baselines: bool = True,
) -> SimResult:
    """Run the tenant, and (with `baselines`) the same traffic without the cache and without
    scale-to-zero, to report the GPU-seconds each one saves."""
    kwargs: dict[str, Any] = {
        "duration": duration,
        "seed": seed,
        "output_tokens": output_tokens,
        "start": start,
    }
    result = Simulation(settings, profile, arrivals, hit_ratio=hit_ratio, **kwargs).run()
    gpu = result.summary["gpu_seconds"]
    saved_cache: float | None = None
    saved_stz: float | None = None
    if baselines:
        if result.summary["cache_hits"] > 0:
            no_cache = [Arrival(a.t, a.prompt_id, a.tenant, False, a.output_tokens) for a in arrivals]
            base = Simulation(settings, profile, no_cache, hit_ratio=0.0, record_series=False, **kwargs).run()
            saved_cache = base.summary["gpu_seconds"] - gpu
        else:
            saved_cache = 0.0
        if settings.min_scale == 0 and settings.enable_scale_to_zero:
            always_on = copy.deepcopy(settings)
            always_on.min_scale = 1
            if always_on.activation_scale and always_on.activation_scale < 1:
                always_on.activation_scale = 0
            base = Simulation(
                always_on, profile, arrivals, hit_ratio=hit_ratio, record_series=False, **kwargs
            ).run()
            saved_stz = base.summary["gpu_seconds"] - gpu
        else:
            saved_stz = 0.0
    result.summary["gpu_seconds_saved_by_cache"] = saved_cache
    result.summary["gpu_seconds_saved_by_scale_to_zero"] = saved_stz
    return result


# --- output --------------------------------------------------------------------------------------

_ROWS: list[tuple[str, str]] = [
    ("requests", "requests"),
    ("cache_hits", "cache hits (served by the transformer)"),
    ("predictor_requests", "sent to the predictor"),
    ("served", "served"),
    ("timed_out", "timed out (503)"),
    ("rejected", "rejected, queue full (503)"),
    ("unfinished", "still in flight at the end"),
    ("latency_p50_s", "latency p50 (s)"),
    ("latency_p99_s", "latency p99 (s)"),
    ("predictor_latency_p50_s", "predictor latency p50 (s)"),
    ("predictor_latency_p99_s", "predictor latency p99 (s)"),
    ("cold_starts", "cold starts (from zero ready pods)"),
    ("cold_start_requests", "requests that waited for a cold start"),
    ("cold_start_wait_max_s", "longest cold-start wait (s)"),
    ("first_answer_after_idle_p50_s", "first answer after idle p50 (s)"),
    ("first_answer_after_idle_max_s", "first answer after idle max (s)"),
    ("peak_pods", "peak pods"),
    ("pods_created", "pods created"),
    ("time_at_zero_s", "time at zero pods (s)"),
    ("panic_s", "time in panic mode (s)"),
    ("gpu_seconds", "GPU-seconds"),
    ("gpu_seconds_saved_by_cache", "GPU-seconds saved by the cache"),
    ("gpu_seconds_saved_by_scale_to_zero", "GPU-seconds saved by scale-to-zero"),
]


def format_summary(summary: dict[str, Any], accelerator: str = "gpu") -> str:
    """The summary as aligned rows. A CPU profile's pods hold no GPU: their seconds are labelled
    pod-seconds (the JSON keys stay `gpu_seconds*`, so scripts reading them do not break)."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}"

    unit = "GPU-seconds" if accelerator == "gpu" else "pod-seconds"
    rows = [(key, label.replace("GPU-seconds", unit)) for key, label in _ROWS]
    width = max(len(label) for _, label in rows)
    return "\n".join(f"{label:<{width}}  {fmt(summary.get(key))}" for key, label in rows)


def plot(result: SimResult, path: Path, title: str = "") -> Path:
    """Four panels over time: in flight, pods desired/ready, activator queue, latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    se = result.series
    t = se["t"]
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    ax = axes[0]
    ax.plot(t, se["in_flight"], lw=0.8, label="requests in flight (predictor)")
    ax.plot(t, se["stable_concurrency"], lw=0.8, ls="--", label="stable window avg")
    ax.plot(t, se["panic_concurrency"], lw=0.8, ls=":", label="panic window avg")
    ax.set_ylabel("concurrency")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    ax.step(t, se["pods_desired"], where="post", lw=1.0, label="pods desired (Deployment)")
    ax.step(t, se["pods_ready"], where="post", lw=1.0, label="pods ready")
    ax.step(t, se["pods_total"], where="post", lw=0.6, alpha=0.6, label="pods existing")
    panic_t = [x for x, p in zip(t, se["panic"], strict=False) if p]
    if panic_t:
        ax.scatter(panic_t, [0] * len(panic_t), s=2, c="red", label="panic mode")
    ax.set_ylabel("pods")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    ax.plot(t, se["activator_queue"], lw=0.8, c="tab:purple", label="held in activator")
    ax.fill_between(t, 0, [v * max(1, max(se["activator_queue"] or [1])) for v in se["activator_in_path"]],
                    step="post", alpha=0.08, color="gray", label="activator in path")  # fmt: skip
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[3]
    hits = [(d, lat) for d, lat, h in result.latencies if h]
    miss = [(d, lat) for d, lat, h in result.latencies if not h]
    if miss:
        ax.scatter([d for d, _ in miss], [lat for _, lat in miss], s=3, label="predictor")
    if hits:
        ax.scatter([d for d, _ in hits], [lat for _, lat in hits], s=3, c="tab:green", label="cache hit")
    ax.set_yscale("log")
    ax.set_ylabel("latency (s)")
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title or f"{result.settings['name']} ({result.profile['name']})")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
