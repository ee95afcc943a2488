"""The fair queue's decision (VTC, transformers_svc/fair_queue.py) row by row, the saturation reader's
pure parts, and the asyncio wrapper over a real HTTP metrics page (no predictor: no lock needed)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from semserve.errors import Overloaded, RateLimited
from transformers_svc.fair_queue import FairQueue, Vtc, VtcWeights, refusal
from transformers_svc.saturation import (
    PredictorLoad,
    Saturation,
    filtered,
    has_room,
    metrics_url_of,
    parse_load,
)


def admit_order(vtc: Vtc, n: int, now: float = 0.0) -> list[str]:
    """Admit the next `n` misses (each released at once with its charge as real usage: prompt 0,
    completion = cost, so the counters move by the charge exactly)."""
    order = []
    for _ in range(n):
        w = vtc.next()
        assert w is not None
        vtc.admit(w, now)
        vtc.release(w, 0, w.cost)
        order.append(w.tenant)
    return order


# (label, arrivals [(tenant, weight, cost)], expected admission order)
ORDER_TABLE = [
    ("one tenant: FIFO", [("a", 1, 10), ("a", 1, 20), ("a", 1, 5)], ["a", "a", "a"]),
    ("equal weights, equal costs: alternate",
     [("a", 1, 10)] * 3 + [("b", 1, 10)] * 3, ["a", "b", "a", "b", "a", "b"]),
    ("weight 2:1, equal costs: two of a per one of b",
     [("a", 2, 10)] * 6 + [("b", 1, 10)] * 3, ["a", "b", "a", "a", "b", "a", "a", "b", "a"]),
    ("cheap requests go more often: token-fair, not request-fair",
     [("big", 1, 100)] * 2 + [("small", 1, 25)] * 5,
     ["big", "small", "small", "small", "small", "big", "small"]),
]  # fmt: skip


@pytest.mark.parametrize("row", ORDER_TABLE, ids=[r[0] for r in ORDER_TABLE])
def test_admission_order(row: tuple) -> None:
    _, arrivals, want = row
    vtc = Vtc()
    for tenant, weight, cost in arrivals:
        vtc.arrive(tenant, weight, cost, 0.0)
    assert admit_order(vtc, len(want)) == want


def test_charges_input_1_output_2_divided_by_weight() -> None:
    vtc = Vtc(VtcWeights(input=1, output=2))
    w = vtc.arrive("a", 2.0, 50, 0.0)
    vtc.admit(w, 0.0)
    assert vtc.tenants["a"].counter == 2 * 50 / 2  # the bound: cost at the output weight
    vtc.release(w, prompt_tokens=10, completion_tokens=20)
    assert vtc.tenants["a"].counter == (10 + 2 * 20) / 2  # the real usage
    vtc.release(w, 10, 20)  # a second release changes nothing
    assert vtc.tenants["a"].counter == 25


def test_return_from_idle_is_lifted_to_the_lowest_backlogged_counter() -> None:
    vtc = Vtc()
    for _ in range(4):
        vtc.arrive("noisy", 1, 100, 0.0)
    admit_order(vtc, 3)  # noisy served 3 x 200 while quiet was idle
    assert vtc.tenants["noisy"].counter == 600
    vtc.arrive("quiet", 1, 10, 0.0)
    # Lifted to noisy's 600, not left at 0 (it would otherwise take the next 30 turns in a row).
    assert vtc.tenants["quiet"].counter == 600
    # Tied: noisy's older miss first, then quiet.
    for _ in range(3):
        vtc.arrive("noisy", 1, 100, 0.0)
    assert admit_order(vtc, 3) == ["noisy", "quiet", "noisy"]


def test_a_tenant_ahead_is_not_lowered_on_return() -> None:
    vtc = Vtc()
    vtc.admit(vtc.arrive("a", 1, 450, 0.0), 0.0)  # in flight, charged 900
    vtc.arrive("b", 1, 10, 0.0)
    vtc.arrive("a", 1, 10, 0.0)
    assert vtc.tenants["a"].counter == 900  # max(own, lowest backlogged)
    assert vtc.next().tenant == "b"


def test_cancel_removes_the_waiter_and_the_next_changes() -> None:
    vtc = Vtc()
    a = vtc.arrive("a", 1, 10, 0.0)
    b = vtc.arrive("b", 1, 10, 0.0)
    assert vtc.next() is a
    vtc.cancel(a)
    assert vtc.next() is b and vtc.depth() == 1
    vtc.cancel(a)  # twice: nothing
    vtc.cancel(b)
    assert vtc.next() is None and vtc.depth() == 0


# (label, queued before [(tenant, weight, cost)], the new miss, misses ahead of it)
AHEAD_TABLE = [
    ("empty queue", [], ("a", 1, 10), 0),
    ("own tenant's queue", [("a", 1, 10)] * 3, ("a", 1, 10), 3),
    ("a quiet tenant ahead of a long noisy queue: at most one (the tie)",
     [("n", 1, 100)] * 20, ("q", 1, 10), 1),
    ("weight 2 vs 1, both queued: the other's share before it",
     [("a", 2, 10)] * 4 + [("b", 1, 10)] * 4, ("b", 1, 10), 8),
]  # fmt: skip


@pytest.mark.parametrize("row", AHEAD_TABLE, ids=[r[0] for r in AHEAD_TABLE])
def test_misses_ahead(row: tuple) -> None:
    _, queued, new, want = row
    vtc = Vtc()
    for tenant, weight, cost in queued:
        vtc.arrive(tenant, weight, cost, 0.0)
    w = vtc.arrive(*new, 0.0)
    assert vtc.ahead_of(w) == want


def test_rate_and_wait_estimate() -> None:
    vtc = Vtc(rate_window_s=10)
    w = vtc.arrive("a", 1, 10, 0.0)
    assert vtc.wait_s(w, 0.0) is None  # no rate yet: never shed on a guess
    vtc.admit(w, 0.0)
    for t in (1.0, 2.0, 3.0):
        vtc.admit(vtc.arrive("a", 1, 10, t), t)
    assert vtc.rate(4.0) == pytest.approx(1.0)  # 4 admissions over 4 s
    for _ in range(5):
        vtc.arrive("a", 1, 10, 4.0)
    last = vtc.arrive("a", 1, 10, 4.0)
    assert vtc.wait_s(last, 4.0) == pytest.approx(6.0)  # 5 ahead + itself, at 1 per second
    assert vtc.rate(30.0) is None  # the window forgot them


def test_shedding_429_over_share_503_otherwise() -> None:
    vtc = Vtc()
    for _ in range(3):
        vtc.admit(vtc.arrive("noisy", 1, 100, 0.0), 0.0)
    quiet_held = vtc.arrive("quiet", 1, 10, 0.0)
    vtc.admit(quiet_held, 0.0)
    noisy = vtc.arrive("noisy", 1, 100, 0.0)
    quiet = vtc.arrive("quiet", 1, 10, 0.0)
    assert refusal(vtc, noisy, 5.0, 10.0) is None  # under the bound: it queues
    over = refusal(vtc, noisy, 12.4, 10.0)
    assert isinstance(over, RateLimited) and over.limit == "fair_share" and over.retry_after_s == 12.4
    assert "noisy" in str(over) and "share" in str(over)
    # quiet holds 10 of 310 tokens in flight, under its half: the predictor is saturated for all.
    sat = refusal(vtc, quiet, 12.4, 10.0)
    assert isinstance(sat, Overloaded) and not isinstance(sat, RateLimited) and sat.retry_after_s == 12.4
    # Alone, a tenant is never over its share: 503.
    solo = Vtc()
    solo.admit(solo.arrive("a", 1, 10, 0.0), 0.0)
    assert isinstance(refusal(solo, solo.arrive("a", 1, 10, 0.0), 99, 10), Overloaded)


# -- saturation ---------------------------------------------------------------------------------------

PAGE = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_running{engine="0",model_name="llm"} 8.0
vllm:num_requests_waiting{engine="0",model_name="llm"} 3.0
vllm:num_requests_waiting{engine="1",model_name="llm"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="llm",reason="capacity"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="llm"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llm"} 0.75
"""

PARSE_TABLE = [
    ("vLLM's page, two engines: waiting summed, the fullest KV", PAGE, PredictorLoad(5.0, 0.75, 8.0)),
    ("no labels", "vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.1\n", PredictorLoad(1.0, 0.1)),
    ("not vLLM", "python_info 1.0\n", None),
    ("empty", "", None),
]


@pytest.mark.parametrize("row", PARSE_TABLE, ids=[r[0] for r in PARSE_TABLE])
def test_parse_load(row: tuple) -> None:
    _, text, want = row
    assert parse_load(text) == want


# (label, load (waiting, kv, running), pending, max_waiting, max_kv, capacity, room)
ROOM_TABLE = [
    ("unknown: fail open", None, 99, 1, 0.5, None, True),
    ("idle", PredictorLoad(0, 0.0), 0, 2, 0.95, None, True),
    ("batch size unknown: as many again as run", PredictorLoad(0, 0.1, 5), 4, 2, 0.95, None, True),
    ("batch size unknown: not more", PredictorLoad(0, 0.1, 5), 5, 2, 0.95, None, False),
    ("batch size unknown, idle: max_waiting", PredictorLoad(0, 0.0, 0), 1, 2, 0.95, None, True),
    ("batch size unknown, idle: not more", PredictorLoad(0, 0.0, 0), 2, 2, 0.95, None, False),
    ("batch size unknown, pending fills the rest", PredictorLoad(1, 0.1, 0), 1, 2, 0.95, None, False),
    ("batch size unknown, waiting at the threshold", PredictorLoad(2, 0.1, 0), 0, 2, 0.95, None, False),
    ("batch of 8, 5 running, 4 admitted since: 1 may wait", PredictorLoad(0, 0.1, 5), 4, 2, 0.95, 8, True),
    ("batch of 8 full, 2 waiting", PredictorLoad(2, 0.1, 8), 0, 2, 0.95, 8, False),
    ("batch of 8 full, 1 waiting", PredictorLoad(1, 0.1, 8), 0, 2, 0.95, 8, True),
    ("KV over", PredictorLoad(0, 0.96), 0, 2, 0.95, None, False),
    ("KV over, batch with room", PredictorLoad(0, 0.96, 1), 0, 2, 0.95, 8, False),
    ("KV at the threshold", PredictorLoad(0, 0.95), 0, 2, 0.95, None, True),
]  # fmt: skip


@pytest.mark.parametrize("row", ROOM_TABLE, ids=[r[0] for r in ROOM_TABLE])
def test_has_room(row: tuple) -> None:
    _, load, pending, max_waiting, max_kv, capacity, want = row
    assert has_room(load, pending, max_waiting, max_kv, capacity) is want


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1:8091", "http://127.0.0.1:8090/metrics"),
    ("127.0.0.1:18081", "http://127.0.0.1:18080/metrics"),
    ("llm-predictor.ns:8081", "http://llm-predictor.ns:8080/metrics"),
    ("llm-predictor.ns:80", "http://llm-predictor.ns:80/metrics"),
])  # fmt: skip
def test_metrics_url_of(host: str, url: str) -> None:
    assert metrics_url_of(host) == url


def test_reads_ask_for_the_three_series_alone() -> None:
    assert filtered("http://p:8090/metrics") == ("http://p:8090/metrics?name[]=vllm:num_requests_waiting"
                                                 "&name[]=vllm:num_requests_running&name[]=vllm:kv_cache_usage_perc")
    assert filtered("http://p/metrics?x=1") == "http://p/metrics?x=1"  # the operator's own query stands


# -- the asyncio wrapper over a real HTTP page ------------------------------------------------------------


class Page:
    """A real HTTP server whose /metrics page the test writes (the predictor's load)."""

    def __init__(self) -> None:
        self.text = "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
        page = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = page.text.encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def load(self, running: int, waiting: int) -> None:
        self.text = (f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
                     "vllm:kv_cache_usage_perc 0.2\n")


@pytest.fixture
def page() -> Iterator[Page]:
    p = Page()
    yield p
    p.server.shutdown()


def test_queue_admits_by_counter_when_room_appears_and_cancel_leaves_cleanly(page: Page) -> None:
    async def scenario() -> None:
        room = Saturation(page.url, poll_s=0.05, max_waiting=1, max_kv=0.95)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        assert not room.has_room()  # before the first read: wait for it, do not guess
        first = await queue.acquire("noisy", 1.0, 100)  # admitted once the first read says room
        assert room.last_read
        await asyncio.sleep(0.15)
        assert room.load == PredictorLoad(0.0, 0.0)
        page.load(running=4, waiting=3)  # a batch of 4, full
        await asyncio.sleep(0.15)
        assert not room.has_room() and room.capacity == 4
        noisy = [asyncio.create_task(queue.acquire("noisy", 1.0, 100)) for _ in range(3)]
        await asyncio.sleep(0.01)
        quiet = asyncio.create_task(queue.acquire("quiet", 1.0, 10))
        gone = asyncio.create_task(queue.acquire("gone", 1.0, 10))
        await asyncio.sleep(0.1)
        assert queue.vtc.depth() == 5
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert queue.vtc.depth() == 4 and "gone" not in [w.tenant for t in queue.vtc.tenants.values()
                                                         for w in t.queue]
        order: list[str] = []  # in the order they were admitted
        for task in (*noisy, quiet):
            task.add_done_callback(lambda _, name="quiet" if task is quiet else "noisy": order.append(name))
        first.release(20, 50)
        page.load(running=0, waiting=0)
        for slot in await asyncio.gather(*noisy, quiet):
            slot.release(10, 40)
        # quiet (lifted to noisy's counter on arrival) goes second at most, not after noisy's three.
        assert order.index("quiet") <= 1, order
        assert queue.vtc.depth() == 0 and len(order) == 4

    asyncio.run(scenario())


def test_unreadable_metrics_fail_open(caplog: pytest.LogCaptureFixture) -> None:
    from tests.support import free_port

    async def scenario() -> None:
        room = Saturation(f"http://127.0.0.1:{free_port()}/metrics", poll_s=0.05, max_waiting=0, max_kv=0.0)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        slots = [await asyncio.wait_for(queue.acquire("a", 1.0, 10), 5) for _ in range(3)]
        assert not room.readable and room.load is None and room.has_room()
        for slot in slots:
            slot.release(1, 1)

    asyncio.run(scenario())


# (label, load, pending, capacity, reserve, room) with max_waiting 2, max_kv 0.95
RESERVE_TABLE = [
    ("busy tenant: batch of 8 filled to 7", PredictorLoad(0, 0.1, 6), 0, 8, 1, True),
    ("busy tenant: not to 8", PredictorLoad(0, 0.1, 7), 0, 8, 1, False),
    ("busy tenant: pending counts", PredictorLoad(0, 0.1, 6), 1, 8, 1, False),
    ("no reserve: 8 running + 1 waiting", PredictorLoad(1, 0.1, 8), 0, 8, 0, True),
    ("batch size not learned: no reserve yet", PredictorLoad(0, 0.1, 7), 0, None, 1, True),
]  # fmt: skip


# (label, load, pending, in_flight, capacity, reserve, room) with max_waiting 2, max_kv 0.95: this
# transformer's own misses in flight are a floor under the predictor's figures, which lag a step.
IN_FLIGHT_TABLE = [
    ("stale figures, more of ours in flight: no room", PredictorLoad(1, 0.1, 8), 0, 10, 8, 0, False),
    ("stale figures, ours fit: the figures decide", PredictorLoad(1, 0.1, 8), 0, 3, 8, 0, True),
    ("figures above ours (other replicas): figures", PredictorLoad(2, 0.1, 8), 0, 1, 8, 0, False),
    ("ours at the batch less the reserve", PredictorLoad(0, 0.1, 5), 0, 7, 8, 1, False),
    ("ours below it, figures agree", PredictorLoad(0, 0.1, 5), 0, 6, 8, 1, True),
]  # fmt: skip


@pytest.mark.parametrize("row", IN_FLIGHT_TABLE, ids=[r[0] for r in IN_FLIGHT_TABLE])
def test_own_misses_in_flight_floor_the_figures(row: tuple) -> None:
    _, load, pending, in_flight, capacity, reserve, want = row
    assert has_room(load, pending, 2, 0.95, capacity, reserve, in_flight) is want


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait for `cond` (a read of the page) without betting on how fast a busy machine reads."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


# (label, load, pending, in_flight, ended, room) with a batch of 8, max_waiting 2, no reserve
ENDED_TABLE = [
    ("full at the read, one of ours ended since: its place", PredictorLoad(2, 0.1, 8), 0, 9, 1, True),
    ("and one admitted since: full again", PredictorLoad(2, 0.1, 8), 1, 9, 1, False),
    ("unlearned batch: ours beyond what runs count as waiting", PredictorLoad(0, 0.1, 2), 0, 4, 0, None),
]  # fmt: skip


@pytest.mark.parametrize("row", ENDED_TABLE, ids=[r[0] for r in ENDED_TABLE])
def test_misses_ended_since_the_read_free_their_places(row: tuple) -> None:
    _, load, pending, in_flight, ended, want = row
    if want is None:  # batch size not learned: room while waiting < max(max_waiting, running) = 2
        assert has_room(load, pending, 2, 0.95, None, 0, in_flight, ended) is False
        assert has_room(load, pending, 2, 0.95, None, 0, 3, ended) is True
        return
    assert has_room(load, pending, 2, 0.95, 8, 0, in_flight, ended) is want


def test_waiting_misses_do_not_make_reads_back_to_back(page: Page) -> None:
    """A read costs the predictor 13-20 ms of its own process while it generates: while misses wait
    for room, reads come at poll_s, not one right after another."""

    async def scenario() -> None:
        room = Saturation(page.url, poll_s=0.1, max_waiting=0, max_kv=0.95)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        page.load(running=4, waiting=1)  # full, and stays full
        waiting = [asyncio.create_task(queue.acquire("noisy", 1.0, 100)) for _ in range(3)]
        await until(lambda: room.reads >= 1)
        reads, started = room.reads, time.monotonic()
        await asyncio.sleep(1.0)
        per_s = (room.reads - reads) / (time.monotonic() - started)
        assert 3 <= per_s <= 12, per_s  # ~10 at poll_s 0.1 (back to back: ~50)
        assert not any(t.done() for t in waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    asyncio.run(scenario())


def test_stale_figures_do_not_let_misses_through_read_after_read(page: Page) -> None:
    """The predictor's figures lag (vLLM publishes them after each engine step, ~0.4 s on this CPU):
    reads that keep saying "8 running, 1 waiting" admit one miss, not one per read."""

    async def scenario() -> None:
        room = Saturation(page.url, poll_s=0.02, max_waiting=2, max_kv=0.95)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        page.load(running=8, waiting=9)  # the batch of 8 is learned
        room.wanted()
        await until(lambda: room.capacity == 8)
        page.load(running=0, waiting=0)
        await until(lambda: room.load is not None and room.load.running == 0)
        slots = [await asyncio.wait_for(queue.acquire("noisy", 1.0, 100), 1) for _ in range(9)]
        page.load(running=8, waiting=1)  # frozen from here on: the figures never show the next ones
        more = [asyncio.create_task(queue.acquire("noisy", 1.0, 100)) for _ in range(5)]
        reads = room.reads
        await until(lambda: room.reads >= reads + 10)  # each past SETTLE_S of the last admission
        assert sum(t.done() for t in more) == 1  # 9 + 1 = capacity + max_waiting
        slots[0].release(1, 1)  # one of ours ended: one more, still not one per read
        reads = room.reads
        await until(lambda: room.reads >= reads + 10)
        assert sum(t.done() for t in more) == 2
        for task in more:
            task.cancel()
        for slot in slots:
            slot.release(1, 1)
        for task in more:
            if task.done() and not task.cancelled():
                task.result().release(1, 1)

    asyncio.run(scenario())


def test_a_slot_dropped_unreleased_gives_its_place_back(page: Page) -> None:
    import gc

    async def scenario() -> None:
        room = Saturation(page.url, poll_s=0.02, max_waiting=0, max_kv=0.95)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        page.load(running=2, waiting=1)  # a batch of 2, learned
        room.wanted()
        await until(lambda: room.capacity == 2)
        page.load(running=0, waiting=0)
        await until(lambda: room.load is not None and room.load.running == 0)
        kept = await asyncio.wait_for(queue.acquire("a", 1.0, 10), 1)
        dropped = await asyncio.wait_for(queue.acquire("b", 1.0, 10), 1)
        third = asyncio.create_task(queue.acquire("c", 1.0, 10))
        reads = room.reads
        await until(lambda: room.reads >= reads + 3)
        assert not third.done()  # two in flight of a batch of 2
        del dropped
        gc.collect()
        (await asyncio.wait_for(third, 1)).release(1, 1)
        assert queue.vtc.busy("b") is False
        kept.release(1, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize("row", RESERVE_TABLE, ids=[r[0] for r in RESERVE_TABLE])
def test_reserve(row: tuple) -> None:
    _, load, pending, capacity, reserve, want = row
    assert has_room(load, pending, 2, 0.95, capacity, reserve) is want


def test_reserved_place_goes_to_a_tenant_with_nothing_in_flight(page: Page) -> None:
    async def scenario() -> None:
        room = Saturation(page.url, poll_s=0.05, max_waiting=1, max_kv=0.95, reserve=1)
        queue = FairQueue("llm", room, max_wait_s=1e9)
        page.load(running=4, waiting=2)  # a batch of 4, learned
        room.wanted()  # reads start with the first miss; here, now
        await asyncio.sleep(0.15)
        assert room.capacity == 4
        page.load(running=2, waiting=0)  # two places free
        await asyncio.sleep(0.15)
        noisy_slots = [await asyncio.wait_for(queue.acquire("noisy", 1.0, 100), 1)]
        page.load(running=3, waiting=0)  # one place free: reserved, noisy has one in flight
        await asyncio.sleep(0.15)
        waiting_noisy = asyncio.create_task(queue.acquire("noisy", 1.0, 100))
        await asyncio.sleep(0.15)
        assert not waiting_noisy.done()
        quiet = await asyncio.wait_for(queue.acquire("quiet", 1.0, 10), 1)  # the reserved place
        assert not waiting_noisy.done()
        page.load(running=0, waiting=0)
        noisy_slots.append(await asyncio.wait_for(waiting_noisy, 2))
        for slot in (*noisy_slots, quiet):
            slot.release(1, 1)

    asyncio.run(scenario())
