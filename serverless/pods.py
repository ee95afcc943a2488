"""The revision's predictor pods: lifecycle (start-up, ready, terminate, drain) and the batch-aware engine
each one runs.

Pods start after a delay drawn from the profile, run at most min(containerConcurrency, max_num_seqs)
requests, and decode with the profile's throughput: with n running, each gets T(n)/n tokens/s after a
prefill of ttft(n). A pod's queue-proxy queues up to 10×containerConcurrency more. Terminated pods stop
taking requests and drain what they hold.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import count

from serverless.events import EPS, EventKind, EventQueue
from serverless.pod_profile import EngineProfile


class RequestState(StrEnum):
    NEW = "new"
    HELD = "held"  # in the activator
    QUEUED = "queued"  # in a pod's queue-proxy
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"
    TIMED_OUT = "timed_out"  # the revision timeout passed first (503)
    REJECTED = "rejected"  # a full queue (503)


@dataclass
class Request:
    id: int
    arrival: float
    hit: bool
    output_tokens: int
    deadline: float
    state: RequestState = RequestState.NEW
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
    version: int = 0  # bumped on each reschedule: older POD events are stale

    @property
    def load(self) -> int:
        return len(self.running) + self.queued

    @property
    def serving(self) -> bool:
        return self.ready and not self.terminating and self.gone_at is None


class ReplicaSet:
    """Every pod the revision's Deployment has had, and what each one does with its requests.
    `on_done` is told of each request a pod finishes."""

    def __init__(
        self,
        profile: EngineProfile,
        container_concurrency: int,
        events: EventQueue,
        rng_startup: random.Random,
        on_done: Callable[[Request], None],
    ) -> None:
        self.profile = profile
        self.events = events
        self.rng_startup = rng_startup
        self.on_done = on_done
        cc = container_concurrency
        self.run_limit = min(cc, profile.max_num_seqs) if cc > 0 else profile.max_num_seqs
        self.queue_limit = 10 * cc if cc > 0 else math.inf  # queue-proxy breaker depth
        self.pods: list[Pod] = []
        self._ids = count()
        self.peak = 0  # most live pods at once

    # --- counts --------------------------------------------------------------------------------

    def ready_count(self) -> int:
        return sum(1 for p in self.pods if p.serving)

    def existing_count(self) -> int:
        return sum(1 for p in self.pods if p.gone_at is None)

    def live(self) -> list[Pod]:
        return [p for p in self.pods if p.gone_at is None and not p.terminating]

    def least_loaded(self) -> Pod:
        return min((p for p in self.pods if p.serving), key=lambda p: p.load)

    def pod_seconds(self, end: float) -> float:
        """Seconds from each pod's creation to its exit (or `end`), summed."""
        return sum((min(p.gone_at, end) if p.gone_at is not None else end) - p.created for p in self.pods)

    # --- lifecycle -----------------------------------------------------------------------------

    def add(self, ready_at: float, ready: bool = False) -> Pod:
        now = self.events.now
        pod = Pod(next(self._ids), created=now, ready_at=ready_at, ready=ready, last_update=now)
        self.pods.append(pod)
        if not ready:
            self.events.push(ready_at, EventKind.POD_READY, pod)
        self.peak = max(self.peak, len(self.live()))
        return pod

    def scale_to(self, replicas: int) -> None:
        live = self.live()
        if len(live) < replicas:
            for _ in range(replicas - len(live)):
                self.add(self.events.now + self.profile.startup.draw(self.rng_startup))
        elif len(live) > replicas:
            # ReplicaSet deletion order: not-ready pods first, then the most recently ready.
            victims = sorted(live, key=lambda p: (p.ready, -p.ready_at, -p.id))[: len(live) - replicas]
            for pod in victims:
                self._terminate(pod)

    def _terminate(self, pod: Pod) -> None:
        pod.terminating = True
        if not pod.ready or pod.load == 0:
            pod.gone_at = self.events.now

    def mark_ready(self, pod: Pod) -> bool:
        """False when the pod was terminated before it got ready."""
        if pod.gone_at is not None or pod.terminating:
            return False
        pod.ready = True
        pod.last_update = self.events.now
        return True

    # --- the engine ----------------------------------------------------------------------------

    def _advance(self, pod: Pod) -> None:
        now = self.events.now
        dt = now - pod.last_update
        if dt > 0 and pod.running:
            rate = self.profile.per_request_tokens_per_s(len(pod.running))
            for r in pod.running:
                if r.state == RequestState.DECODE:
                    r.remaining -= rate * dt
        pod.last_update = now

    def _reschedule(self, pod: Pod) -> None:
        pod.version += 1
        if not pod.running:
            return
        now = self.events.now
        rate = self.profile.per_request_tokens_per_s(len(pod.running))
        nxt = math.inf
        for r in pod.running:
            if r.state == RequestState.PREFILL:
                nxt = min(nxt, r.prefill_end)
            else:
                nxt = min(nxt, now + max(r.remaining, 0.0) / rate)
        self.events.push(max(nxt, now), EventKind.POD, (pod, pod.version))

    def _start(self, pod: Pod, req: Request) -> None:
        req.state = RequestState.PREFILL
        req.prefill_end = self.events.now + self.profile.ttft(len(pod.running) + 1)
        req.remaining = float(req.output_tokens)
        pod.running.append(req)

    def send(self, pod: Pod, req: Request) -> bool:
        """False when the pod's queue-proxy queue is full (503)."""
        self._advance(pod)
        if len(pod.running) < self.run_limit:
            self._start(pod, req)
            self._reschedule(pod)
        else:
            if pod.queued >= self.queue_limit:
                return False
            req.state = RequestState.QUEUED
            pod.queue.append(req)
            pod.queued += 1
        return True

    def unqueue(self, req: Request) -> None:
        """A queued request timed out: its pod stops counting it (the entry is skipped lazily)."""
        for p in self.pods:
            if req in p.queue:
                p.queued -= 1
                break

    def on_event(self, pod: Pod, version: int) -> bool:
        """Prefills end, decodes finish, queued requests start. True when a request finished."""
        if version != pod.version:
            return False
        now = self.events.now
        self._advance(pod)
        finished = False
        for r in list(pod.running):
            if r.state == RequestState.PREFILL and r.prefill_end <= now + EPS:
                r.state = RequestState.DECODE
                r.first_token = now
            elif r.state == RequestState.DECODE and r.remaining <= 1e-6:
                r.state, r.done = RequestState.DONE, now
                pod.running.remove(r)
                self.on_done(r)
                finished = True
        while pod.queue and len(pod.running) < self.run_limit:
            r = pod.queue.popleft()
            if r.state != RequestState.QUEUED:
                continue  # timed out while queued
            pod.queued -= 1
            self._start(pod, r)
        self._reschedule(pod)
        if pod.terminating and pod.load == 0 and pod.gone_at is None:
            pod.gone_at = now
        return finished
