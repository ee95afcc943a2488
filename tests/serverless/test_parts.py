"""The simulation's parts on their own: the event queue, the concurrency meter, pods and the activator."""

from __future__ import annotations

import random

import pytest

from serverless.activator import Activator
from serverless.events import ConcurrencyMeter, EventKind, EventQueue
from serverless.pod_profile import EngineProfile, StartupModel
from serverless.pods import ReplicaSet, Request


def test_events_pop_in_time_then_push_order() -> None:
    q = EventQueue()
    q.push(2.0, EventKind.TICK, "late")
    q.push(1.0, EventKind.SCRAPE, "first")
    q.push(1.0, EventKind.ARRIVE, "second")  # same time: pushed later, popped later
    q.every(0.5, EventKind.SCRAPE, until=1.0)
    popped = []
    while q:
        popped.append(q.pop())
    assert [(t, p) for t, _, p in popped] == [(0.5, None), (1.0, "first"), (1.0, "second"), (1.0, None),
                                              (2.0, "late")]  # fmt: skip


def test_concurrency_meter_averages_over_each_report_interval() -> None:
    m = ConcurrencyMeter()
    m.add(0.0)
    m.add(0.5)
    m.remove(1.0)
    # 1 request for 0.5 s, then 2 for 0.5 s: 1.5 on average over the first second.
    assert m.average_since_last_report(1.0) == pytest.approx(1.5)
    assert m.average_since_last_report(2.0) == pytest.approx(1.0)
    assert m.average_since_last_report(2.0) == 1.0  # an empty interval: the count itself


def _replicas(events: EventQueue, done: list[Request], cc: int = 1) -> ReplicaSet:
    profile = EngineProfile(
        name="t", concurrency=[1], tokens_per_s=[10.0], ttft_s=[0.5], max_num_seqs=4,
        startup=StartupModel(schedule_s=(0.0, 0.0), warmup_s=(30.0, 30.0)),
    )  # fmt: skip
    return ReplicaSet(profile, cc, events, random.Random(0), on_done=done.append)


def test_pods_start_serve_and_drain() -> None:
    events, done = EventQueue(), []
    rs = _replicas(events, done)
    rs.scale_to(1)
    (pod,) = rs.pods
    assert pod.ready_at == 30.0 and rs.ready_count() == 0
    t, kind, payload = events.pop()
    assert (t, kind, payload) == (30.0, EventKind.POD_READY, pod)
    events.now = t
    assert rs.mark_ready(pod) and rs.ready_count() == 1
    req = Request(0, arrival=30.0, hit=False, output_tokens=10, deadline=330.0)
    assert rs.send(pod, req) and req.state == "prefill"
    rs.scale_to(0)  # terminating with a request in flight: it drains first
    assert pod.terminating and pod.gone_at is None
    while events:
        t, kind, (p, version) = events.pop()
        events.now = t
        rs.on_event(p, version)
    assert done == [req] and req.first_token == 30.5 and req.done == pytest.approx(31.5)
    assert pod.gone_at == pytest.approx(31.5) and rs.pod_seconds(100.0) == pytest.approx(31.5)


def test_activator_holds_fifo_up_to_its_depth_and_releases_when_a_pod_has_room() -> None:
    events, done = EventQueue(), []
    rs = _replicas(events, done, cc=1)
    activator = Activator(queue_depth=2, container_concurrency=1, replicas=rs)
    reqs = [Request(i, 0.0, False, 10, deadline=300.0) for i in range(3)]
    assert activator.note_request() and not activator.note_request()  # only the first is "first"
    assert activator.hold(reqs[0]) and activator.hold(reqs[1]) and not activator.hold(reqs[2])
    reqs[0].state = "timed_out"
    activator.expire(reqs[0])
    forwarded = []
    activator.release(lambda pod, req: forwarded.append(req))
    assert forwarded == []  # no pod yet
    rs.add(ready_at=0.0, ready=True)
    activator.release(lambda pod, req: (forwarded.append(req), rs.send(pod, req)))
    assert forwarded == [reqs[1]] and activator.held_live == 0
    report = activator.end_interval()
    assert report.active and report.first_request_adjust == 1.0
    assert not activator.end_interval().active
