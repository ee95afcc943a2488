"""Whether the predictor has room for another miss, from the predictor's own metrics (issue 27
item 5), as llm-d's gateway decides: vLLM's `vllm:num_requests_waiting` (requests its scheduler
holds because the running batch is full) and `vllm:kv_cache_usage_perc` (a fraction, 0-1), read
from the predictor's Prometheus endpoint every `poll_s` while misses come (a new miss waiting for
room asks for a read sooner, at most every `MIN_GAP_S`); the reads pause while no miss comes
(`IDLE_S`). A read is not free: the whole page is ~56 kB, 13-20 ms of the predictor's own process
while it generates on this CPU, so reads ask for the three series alone (`name[]`,
semserve/serving/metrics_filter.py) and a queue of waiting misses does not make them back to back.

The figures lag by an engine step or more (vLLM publishes them after each step: ~0.4 s with 8
requests on 2 CPU cores), so between reads this transformer corrects them with what it knows
exactly: the misses it admitted since the last read and not ended (`pending`, not in the figures
yet), those of its misses counted in the figures that ended since (`ended`: their places are free
now), and, as a floor under the result, its own misses in flight (admitted, not ended). Without the
floor a miss left `pending` before the lagging figures showed it, each stale read let another miss
through, and the predictor's own queue grew without bound.

The predictor's batch size (its max_num_seqs) is learned as the most requests seen running while
others waited. Room: KV use at most `max_kv`, and the requests in the predictor below that batch
size + `max_waiting` (so at most about `max_waiting` misses wait in the predictor's own
first-come-first-served queue; the rest wait here, in fair order). Several replicas read the same
predictor, so its signal couples them.

The first misses wait for the first read (it starts with the first miss). The endpoint unreadable
(wrong URL, predictor starting): one warning line, and every miss is admitted (fail open) until a
read succeeds again (one info line then).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from semserve.logs import get_logger

if TYPE_CHECKING:
    import httpx

log = get_logger("semserve.transformer.saturation")

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
MIN_GAP_S = 0.02  # the soonest a waiting miss makes the next read
READ_TIMEOUT_S = 1.0
SETTLE_S = 0.1  # from admission until the miss is surely in the predictor's figures (gRPC hop)
IDLE_S = 2.0  # reads pause this long after the last miss (a predictor's /metrics page is ~70 kB)


@dataclass(frozen=True)
class PredictorLoad:
    waiting: float  # requests waiting in the predictor's scheduler (all engines)
    kv_usage: float  # the fullest engine's KV cache use, 0-1
    running: float = 0.0  # requests in its running batch (all engines)


def parse_load(text: str) -> PredictorLoad | None:
    """The two series from a Prometheus text page; None when the page has neither (not vLLM)."""
    waiting: float | None = None
    kv: float | None = None
    running = 0.0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in (WAITING, KV_USAGE, RUNNING):
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if name == WAITING:
            waiting = (waiting or 0.0) + value
        elif name == RUNNING:
            running += value
        else:
            kv = max(kv or 0.0, value)
    if waiting is None and kv is None:
        return None
    return PredictorLoad(waiting or 0.0, kv or 0.0, running)


def has_room(
    load: PredictorLoad | None, pending: int, max_waiting: int, max_kv: float, capacity: float | None = None,
    reserve: int = 0, in_flight: int = 0, ended: int = 0,
) -> bool:
    """Room for one more miss: no load known (fail open); else KV use at most `max_kv` and, with
    the predictor's batch size learned (`capacity`), running + waiting + pending below capacity +
    `max_waiting`; before it is learned (it is when the batch overflows), waiting + pending below
    the larger of `max_waiting` and the requests running (a burst doubles what runs per read).
    With `reserve` (a miss of a tenant that has misses in flight, --fair-reserve), a learned batch
    is filled only to capacity - reserve: those places wait for a tenant with nothing in flight.
    `in_flight`: this transformer's misses admitted and not ended, a floor under the (lagging)
    figures; `ended`: its misses counted by the last read that have ended since."""
    if load is None:
        return True
    if load.kv_usage > max_kv:
        return False
    if capacity is not None:
        inside = max(load.running + load.waiting + pending - ended, in_flight)
        if reserve > 0:
            return inside < capacity - reserve
        return inside < capacity + max_waiting
    waiting = max(load.waiting + pending - ended, in_flight - load.running)
    return waiting < max(max_waiting, load.running)


def filtered(url: str) -> str:
    """`url` asking for the three series alone (`name[]`, as Prometheus's exposition filters; a server
    that ignores it sends its whole page, which parses the same). A URL with a query is kept as is."""
    if "?" in url:
        return url
    return url + "?" + "&".join(f"name[]={name}" for name in (WAITING, RUNNING, KV_USAGE))


def metrics_url_of(predictor_host: str) -> str:
    """The predictor's HTTP /metrics from its gRPC address: the port below the gRPC one (KServe's
    8080/8081, the predictor's 8090/8091); Knative's single port 80 as it is."""
    host, _, port = predictor_host.rpartition(":")
    if not host or not port.isdigit():
        return f"http://{predictor_host}/metrics"
    p = int(port)
    http_port = p if p in (80, 443) else p - 1
    return f"http://{host}:{http_port}/metrics"


class Saturation:
    """The fair queue's Room: the last read of the predictor's load and the misses since."""

    def __init__(self, url: str, poll_s: float, max_waiting: int, max_kv: float, reserve: int = 0) -> None:
        self.url, self.poll_s, self.max_waiting, self.max_kv = filtered(url), poll_s, max_waiting, max_kv
        self.reserve = reserve
        self.load: PredictorLoad | None = None
        self.readable = True
        # Misses admitted and not ended, by number: admission time. A read that started SETTLE_S
        # after a miss was admitted has it in its figures (the miss reached the engine by then).
        self._pending: dict[int, float] = {}
        self._admissions = 0
        self._in_flight: set[int] = set()  # admitted, not ended (exact: no read involved)
        self._ended = 0  # misses counted by the last read that ended since
        self.reads = 0  # reads made (for tests)
        self._callbacks: list[Callable[[], None]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_read = 0.0
        self._active = 0.0  # time.monotonic() of the last miss admitted or waiting
        # The predictor's batch size: the most requests seen running while some waited.
        self.capacity: float | None = None

    # -- Room ---------------------------------------------------------------------------------------

    def has_room(self, busy: bool = False) -> bool:
        """Room for a miss; `busy`: of a tenant with misses in flight (kept off the reserve)."""
        self._start()
        if not self.last_read:  # the first read is under way (milliseconds): not a guess before it
            return False
        reserve = self.reserve if busy else 0
        return has_room(self.load, self.pending, self.max_waiting, self.max_kv, self.capacity, reserve,
                        len(self._in_flight), self._ended)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admitted(self) -> object:
        self._active = time.monotonic()
        self._wake_if_idle()
        self._admissions += 1
        self._pending[self._admissions] = self._active
        self._in_flight.add(self._admissions)
        return self._admissions

    def released(self, token: object) -> None:
        if isinstance(token, int) and token in self._in_flight:
            self._in_flight.discard(token)
            if self._pending.pop(token, None) is None:  # the last read counted it: its place is free
                self._ended += 1

    def wanted(self) -> None:
        """A new miss waits for room: a read soon (one that has just been made says no room)."""
        self.waiting()
        if self._wake is not None and time.monotonic() - self.last_read >= self.poll_s / 2:
            self._wake.set()

    def waiting(self) -> None:
        """Misses still wait: reads go on at `poll_s`."""
        self._active = time.monotonic()
        self._start()

    def _wake_if_idle(self) -> None:
        # After a pause, the first miss goes by the last read; the next read is made now.
        if self._wake is not None and time.monotonic() - self.last_read > 2 * self.poll_s + MIN_GAP_S:
            self._wake.set()

    def on_change(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    # -- reading ------------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._poll())

    async def _poll(self) -> None:
        import httpx  # here: the transformer's start does not pay for it

        assert self._wake is not None
        async with httpx.AsyncClient(timeout=READ_TIMEOUT_S) as client:
            while True:
                await self.read(client)
                # Idle (no miss admitted or waiting for IDLE_S): no reads until the next miss, which
                # goes by the last read and asks for a fresh one.
                idle = time.monotonic() - self._active > IDLE_S
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if idle else self.poll_s):
                        await self._wake.wait()
                self._wake.clear()
                await asyncio.sleep(MIN_GAP_S)

    async def read(self, client: httpx.AsyncClient) -> None:
        """One read of the predictor's load; then whoever waits for room looks again."""
        import httpx

        started = time.monotonic()
        try:
            resp = await client.get(self.url)
            resp.raise_for_status()
            load = parse_load(resp.text)
            if load is None:
                raise ValueError(f"no {WAITING} or {KV_USAGE} series")
        except (httpx.HTTPError, ValueError) as exc:
            if self.readable:
                log.warning("predictor_metrics_unreadable", url=self.url,
                            error=f"{type(exc).__name__}: {exc}",
                            effect="fair admission admits every miss (fail open) until they are readable")
            self.readable = False
            self.load = None
        else:
            if not self.readable:
                log.info("predictor_metrics_readable", url=self.url)
            self.readable = True
            self.load = load
            if load.waiting > 0 and load.running > 0:
                self.capacity = max(self.capacity or 0.0, load.running)
        # Misses admitted SETTLE_S before this read started are in its figures (or finished).
        self._pending = {k: t for k, t in self._pending.items() if t > started - SETTLE_S}
        self._ended = 0
        self.reads += 1
        self.last_read = time.monotonic()
        for callback in self._callbacks:
            callback()
