"""More faults between the transformer and its peers, through tests.support.FaultProxy: Redis slow
(50 ms and 2 s per chunk) or unreachable from the start, the predictor slow or hanging, and the
transformer SIGTERMed under load.

Every test checks the same four things: no request hangs past its client timeout; no 5xx but the
documented 503 for misses the predictor cannot answer; no wrong or partial answer served or stored
(temperature 0: the text equals the predictor's own answer for that prompt); recovery without
restarting anything else.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Predictor, Transformer, start_transformer
from tests.support import FaultProxy, free_port, metric_value

CLIENT_TIMEOUT_S = 60.0
_refs: dict[tuple[str, int, bool], str] = {}


def v2_body(prompt: str, max_tokens: int = 8, ignore_eos: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
    if ignore_eos:
        params["ignore_eos"] = True
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": params,
    }


def output(r: httpx.Response, name: str) -> Any:
    return next(o for o in r.json()["outputs"] if o["name"] == name)["data"][0]


def reference(predictor: Predictor, prompt: str, max_tokens: int = 8, ignore_eos: bool = False) -> str:
    """The predictor's own answer (v2 REST, straight to it), once per prompt."""
    key = (prompt, max_tokens, ignore_eos)
    if key not in _refs:
        r = httpx.post(f"{predictor.http}/v2/models/llm/infer", json=v2_body(prompt, max_tokens, ignore_eos),
                       timeout=CLIENT_TIMEOUT_S)
        assert r.status_code == 200, r.text
        _refs[key] = str(output(r, "text_output"))
    return _refs[key]


def ask(t: Transformer, predictor: Predictor, prompt: str) -> tuple[str, float]:
    """One v2 request through the transformer: must be a 200 whose text is the predictor's."""
    started = time.monotonic()
    r = httpx.post(f"{t.http}/v2/models/llm/infer", json=v2_body(prompt), timeout=CLIENT_TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert output(r, "text_output") == reference(predictor, prompt), prompt
    return str(output(r, "cache_status")), elapsed


def metrics(t: Transformer) -> str:
    return httpx.get(f"{t.http}/metrics", timeout=10).text


def until_exact(t: Transformer, predictor: Predictor, prompt: str, within_s: float = 30) -> list[str]:
    deadline = time.monotonic() + within_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        seen.append(ask(t, predictor, prompt)[0])
        if seen[-1] == "exact":
            return seen
        time.sleep(1.0)
    raise AssertionError(f"no exact hit after recovery: {seen}")


@pytest.fixture(scope="module")
def slow_redis(
    predictor: Predictor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Transformer, FaultProxy]]:
    from semserve.tooling.local_redis import RedisServer

    port = free_port()
    redis = RedisServer(port, data_dir=tmp_path_factory.mktemp("redis-slow")).start()
    proxy = FaultProxy(port).start()
    t = start_transformer("redis-slow", predictor.grpc, f"redis://127.0.0.1:{proxy.port}/0")
    try:
        yield t, proxy
    finally:
        t.process.stop()
        proxy.stop()
        redis.stop()


def test_redis_50ms_per_chunk_fails_open(
    slow_redis: tuple[Transformer, FaultProxy], predictor: Predictor
) -> None:
    t, proxy = slow_redis
    q = f"Name a planet ({uuid.uuid4().hex[:6]})."
    assert ask(t, predictor, q)[0] == "miss"
    assert ask(t, predictor, q)[0] == "exact"
    errors_before = metric_value(metrics(t), "semserve_cache_lookups_total", result="error")
    # 50 ms each way per chunk: every Redis round trip costs >= 100 ms, past the 50 ms budget of
    # the semantic lookup (KNN): each new prompt's lookup times out (a miss, counted as an error).
    # The exact read and the stores have the store's 500 ms budget, so the answer stored for `q`
    # is still served (read-your-writes) and Redis is not taken out of the path; every request is
    # answered, correctly.
    proxy.latency_s = 0.05
    try:
        statuses = [ask(t, predictor, p) for p in (q, f"{q} again", q, f"{q} once more", q)]
        assert [statuses[1][0], statuses[3][0]] == ["miss", "miss"], statuses
        assert {s for s, _ in statuses[0::2]} <= {"exact", "miss"}, statuses
        assert "exact" in {s for s, _ in statuses[0::2]}, statuses
        assert all(elapsed < 30 for _, elapsed in statuses), statuses
        text = metrics(t)
        assert metric_value(text, "semserve_cache_lookups_total", result="error") >= errors_before + 1
    finally:
        proxy.clear()
    until_exact(t, predictor, q)
    assert metric_value(metrics(t), "semserve_cache_degraded") == 0
    # What was written while slow (if anything) is right: those prompts now hit or miss correctly.
    ask(t, predictor, f"{q} again")


def test_redis_2s_per_chunk_costs_only_the_budget(slow_redis: tuple[Transformer, FaultProxy],
                                                  predictor: Predictor) -> None:
    t, proxy = slow_redis
    q = f"Name a bird ({uuid.uuid4().hex[:6]})."
    prompts = [q, f"{q} twice", q, f"{q} thrice"]
    for p in prompts:
        reference(predictor, p)  # measured below: only the transformer's own time
    before = metrics(t)
    proxy.latency_s = 2.0
    try:
        timings = [ask(t, predictor, p) for p in prompts]
        after = metrics(t)
    finally:
        proxy.clear()
    assert {s for s, _ in timings} == {"miss"}, timings
    assert all(elapsed < 15 for _, elapsed in timings), timings
    # The cache's own time per request is the lookup budget, not the 2 s Redis now takes.
    def delta(name: str) -> float:
        return metric_value(after, name) - metric_value(before, name)

    n = delta("semserve_cache_lookup_seconds_count")
    total = delta("semserve_cache_lookup_seconds_sum")
    assert n >= len(prompts) and total / n < 0.5, (n, total)
    assert statistics.median(e for _, e in timings) < 10
    assert metric_value(after, "semserve_cache_degraded") == 1
    # Latency gone: caching resumes by itself, answers still right.
    p2 = f"Name a fish ({uuid.uuid4().hex[:6]})."
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and metric_value(metrics(t), "semserve_cache_degraded") != 0:
        ask(t, predictor, p2)
        time.sleep(1.0)
    until_exact(t, predictor, p2)
    until_exact(t, predictor, q)


def test_redis_unreachable_from_the_start(predictor: Predictor) -> None:
    closed = free_port()
    t = start_transformer("redis-never", predictor.grpc, f"redis://127.0.0.1:{closed}/0")
    try:
        q = f"Name a tree ({uuid.uuid4().hex[:6]})."
        for p in (q, q, f"{q} again"):
            status, elapsed = ask(t, predictor, p)
            assert status == "miss" and elapsed < 30
        assert t.process.proc is not None and t.process.proc.poll() is None
        assert metric_value(metrics(t), "semserve_cache_degraded") == 1
        assert httpx.get(f"{t.http}/v2/health/ready", timeout=10).status_code == 200
    finally:
        t.process.stop()


def test_predictor_slow_or_hanging_503_within_timeout(predictor: Predictor, redis_url: str) -> None:
    grpc_port = int(predictor.grpc.rsplit(":", 1)[1])
    proxy = FaultProxy(grpc_port).start()
    t = start_transformer("predictor-slow", f"127.0.0.1:{proxy.port}", redis_url,
                          "--predictor-timeout-s", "3")
    url = f"{t.http}/v2/models/llm/infer"
    tag = uuid.uuid4().hex[:6]
    prompts = {mode: f"Name a {mode} instrument ({tag})." for mode in ("fast", "slow", "hung")}
    try:
        for p in prompts.values():
            reference(predictor, p)
        outcomes: dict[str, int] = {}
        for mode, latency, blackhole in (("fast", 0.05, False), ("slow", 1.5, False), ("hung", 0.0, True)):
            proxy.latency_s, proxy.blackhole = latency, blackhole
            started = time.monotonic()
            r = httpx.post(url, json=v2_body(prompts[mode]), timeout=CLIENT_TIMEOUT_S)
            elapsed = time.monotonic() - started
            proxy.clear()
            outcomes[mode] = r.status_code
            assert r.status_code in (200, 503), r.text
            assert elapsed < 3 + 5, (mode, elapsed)
            if r.status_code == 200:
                assert output(r, "text_output") == reference(predictor, prompts[mode])
            else:
                assert "predictor" in r.text
        assert outcomes["fast"] == 200 and outcomes["hung"] == 503, outcomes
        # Recovered, no restart: every prompt answered right; what failed was not stored.
        for mode, p in prompts.items():
            deadline = time.monotonic() + 20
            while True:
                r = httpx.post(url, json=v2_body(p), timeout=CLIENT_TIMEOUT_S)
                if r.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code == 200, r.text
            assert output(r, "text_output") == reference(predictor, p)
            expected = "exact" if outcomes[mode] == 200 else "miss"
            assert output(r, "cache_status") == expected, (mode, outcomes)
    finally:
        t.process.stop()
        proxy.stop()


def test_sigterm_under_load_drains(predictor: Predictor, redis_url: str) -> None:
    t = start_transformer("sigterm-load", predictor.grpc, redis_url, "--grace-period-s", "60")
    tag = uuid.uuid4().hex[:6]
    prompts = [f"Tell a long story about robot number {i} ({tag})." for i in range(8)]
    # Long enough to be in flight at SIGTERM: 100 tokens were all answered within 1.5 s once, on a
    # faster machine; 200 take 44-49 s here in a batch of 8.
    tokens = 200
    results: dict[int, httpx.Response | BaseException] = {}

    def fire(i: int) -> None:
        try:
            results[i] = httpx.post(f"{t.http}/v2/models/llm/infer",
                                    json=v2_body(prompts[i], tokens, ignore_eos=True), timeout=120)
        except BaseException as e:  # recorded and asserted below
            results[i] = e

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(8)]
    try:
        for th in threads:
            th.start()
        time.sleep(1.5)  # in flight at the predictor
        assert not results, "answered before SIGTERM: make the requests slower"
        t.process.signal(signal.SIGTERM)
        time.sleep(0.3)
        try:
            late = httpx.post(f"{t.http}/v2/models/llm/infer", json=v2_body(f"late ({tag})"), timeout=30)
            assert late.status_code == 503, late.text
        except httpx.TransportError:
            pass  # listener already closed: refused
        for th in threads:
            th.join(150)
        # Whole answers: every token asked for. Not compared with a direct answer: greedy decoding
        # of long answers on this CPU backend depends on the batch it ran in (seen: texts part after
        # ~70 characters), so equality is checked on the short answers of the other tests.
        for i in range(8):
            r = results[i]
            assert isinstance(r, httpx.Response), repr(r)
            assert r.status_code == 200, r.text
            assert int(output(r, "completion_tokens")) == tokens
            assert output(r, "finish_reason") == "length"
            # The text of all the tokens: a drain that cut it would leave far less (a token here is
            # one to a few characters).
            assert len(str(output(r, "text_output"))) >= 80
        assert t.process.proc is not None
        assert t.process.proc.wait(60) == 0
    finally:
        t.process.stop()
