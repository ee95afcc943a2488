"""Knative's activator: in the request path while the SKS is in Proxy mode or no pod is ready.

It holds requests FIFO (a bounded queue: 503 when full) until a pod has room (`containerConcurrency`;
at once when that is 0), and reports a revision's first request at once, which is what lets the
autoscaler poke the decider of a revision at zero.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from serverless.pods import Pod, ReplicaSet, Request, RequestState


@dataclass
class IntervalReport:
    """What the activator contributes to one scrape interval."""

    active: bool  # it saw or held requests, so the revision has a stat even with no ready pod
    first_request_adjust: float  # the first-request report already recorded, to count it once


class Activator:
    def __init__(self, queue_depth: int, container_concurrency: int, replicas: ReplicaSet) -> None:
        self.queue_depth = queue_depth
        self.container_concurrency = container_concurrency
        self.replicas = replicas
        self.held: deque[Request] = deque()
        self.held_live = 0  # live entries in `held` (timed-out ones are skipped lazily)
        self._busy_interval = False  # saw requests since its last report
        self._had_stat = False  # Knative deletes an idle activator stat; the next request is "first"
        self._first_request_adjust = 0.0

    def target(self) -> Pod | None:
        """The least-loaded ready pod with room, if any."""
        cc = self.container_concurrency
        best: Pod | None = None
        for p in self.replicas.pods:
            if p.serving and (cc == 0 or p.load < cc) and (best is None or p.load < best.load):
                best = p
        return best

    def note_request(self) -> bool:
        """A request passes through; True when it is the revision's first since its stat was dropped
        (the activator reports it at once, with concurrency 1)."""
        self._busy_interval = True
        if self._had_stat:
            return False
        self._had_stat = True
        self._first_request_adjust = 1.0
        return True

    def hold(self, req: Request) -> bool:
        """False when the queue is full (503)."""
        if self.held_live >= self.queue_depth:
            return False
        req.state = RequestState.HELD
        self.held.append(req)
        self.held_live += 1
        return True

    def expire(self, req: Request) -> None:
        """A held request timed out (its entry is skipped lazily)."""
        self.held_live -= 1

    def release(self, forward: Callable[[Pod, Request], None]) -> None:
        """Forward held requests, oldest first, while some pod has room."""
        while self.held:
            head = self.held[0]
            if head.state != RequestState.HELD:
                self.held.popleft()
                continue
            pod = self.target()
            if pod is None:
                return
            self.held.popleft()
            self.held_live -= 1
            forward(pod, head)

    def end_interval(self) -> IntervalReport:
        active = self._busy_interval or self.held_live > 0
        report = IntervalReport(active, self._first_request_adjust)
        self._first_request_adjust = 0.0
        self._had_stat = active
        self._busy_interval = False
        return report
