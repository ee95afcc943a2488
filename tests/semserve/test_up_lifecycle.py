"""`semserve up` dies without leaving anything behind and keeps its cache (issue 29), on one stack
(Redis + transformer, the suite's predictor standing in for its own) started three times on the
same ports and data directory:

1. an entry cached, Redis SIGKILLed: the supervisor restarts it and the entry is still a hit;
   then `semserve up` SIGKILLed: every process it started is gone, and up.json reads "stopped";
2. started again: the entry is a hit (the stack restart kept it); the transformer SIGSTOPped (it
   cannot act on its parent-death signal), `semserve up` SIGKILLed: the rest is gone;
3. started again: it says it stops the transformer left over, does, serves, and SIGHUP (the
   terminal closed) stops it with exit code 0 and nothing left.

Processes are found by PID (psutil, from the supervisor's pid), never by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import httpx
import psutil
import pytest

from semserve.supervise import read_status
from tests.conftest import Predictor
from tests.support import ROOT, free_port, metric_value

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux parent-death signals")

CHAT = {
    "model": "llm",
    "temperature": 0,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Name a colour of the rainbow (issue 29)."}],
}


@dataclass
class Stack:
    predictor_grpc_port: str
    dir: Path
    http: int = 0
    grpc: int = 0
    redis: int = 0
    up: subprocess.Popen[bytes] | None = None
    runs: int = 0

    def __post_init__(self) -> None:
        self.http, self.grpc, self.redis = free_port(), free_port(), free_port()

    @property
    def out(self) -> Path:
        return self.dir / f"up-{self.runs}.out"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    def start(self) -> None:
        self.runs += 1
        argv = [
            sys.executable, "-m", "semserve", "up", "--without", "predictor",
            "--predictor-grpc-port", self.predictor_grpc_port,
            "--transformer-http-port", str(self.http), "--transformer-grpc-port", str(self.grpc),
            "--redis-port", str(self.redis), "--log-dir", str(self.dir / "logs"),
            "--redis-data-dir", str(self.dir / "redis"), "--ready-timeout-s", "240",
        ]  # fmt: skip
        with self.out.open("wb") as out:
            self.up = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        self.wait("banner", lambda: "semserve is up." in self.out.read_text(), 300)

    def wait(self, what: str, cond: Callable[[], bool], timeout_s: float) -> None:
        assert self.up is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.up.poll() is None, f"semserve up exited {self.up.returncode}:\n{self.out.read_text()}"
            if cond():
                return
            time.sleep(0.3)
        raise AssertionError(f"{what} not within {timeout_s}s:\n{self.out.read_text()[-3000:]}")

    def component(self, name: str) -> psutil.Process:
        assert self.up is not None
        pid = next(s.pid for s in read_status(self.dir / "logs" / "up.json") if s.name == name)
        assert pid is not None
        proc = psutil.Process(pid)
        assert proc.ppid() == self.up.pid
        return proc

    def processes(self) -> list[psutil.Process]:
        """Everything `semserve up` runs now, found from its pid."""
        assert self.up is not None
        return psutil.Process(self.up.pid).children(recursive=True)

    def ask(self) -> str:
        r = httpx.post(f"{self.base}/openai/v1/chat/completions", json=CHAT, timeout=120)
        assert r.status_code == 200, r.text
        return str(r.headers["x-semserve-cache"])

    def ask_until(self, wanted: str, within_s: float = 30) -> list[str]:
        """Cache statuses until `wanted` (the transformer probes a Redis that was down ~1/s)."""
        seen: list[str] = []
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            seen.append(self.ask())
            if seen[-1] == wanted:
                break
            time.sleep(0.5)
        return seen

    def kill_up(self, sig: int = signal.SIGKILL) -> int:
        assert self.up is not None
        self.up.send_signal(sig)
        return self.up.wait(90)


def _gone(procs: list[psutil.Process], timeout_s: float = 20) -> list[psutil.Process]:
    _dead, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_up_dies_whole_and_keeps_its_cache(predictor: Predictor, tmp_path: Path) -> None:
    stack = Stack(predictor.grpc.rsplit(":", 1)[1], tmp_path)
    leftovers: list[psutil.Process] = []
    try:
        # 1. A cached entry survives a Redis SIGKILL.
        stack.start()
        assert stack.ask() == "miss"
        assert stack.ask() == "exact"
        time.sleep(1.5)  # the append-only file is fsynced every second
        redis_server = [p for p in stack.component("redis").children(recursive=True)]
        assert redis_server, "no Redis server under the redis component"
        for p in redis_server:
            p.kill()
        stack.wait("redis back", lambda: "redis ready again (restart 1)" in stack.out.read_text(), 60)
        assert stack.ask_until("exact")[-1] == "exact"

        # ... and SIGKILL of `semserve up` takes every process it started with it.
        before = stack.processes()
        assert {"redis", "transformer"} <= {s.name for s in read_status(tmp_path / "logs" / "up.json")}
        assert stack.kill_up() == -signal.SIGKILL
        left = _gone(before)
        assert not left, f"left running after SIGKILL of semserve up: {left}"
        assert {s.state for s in read_status(tmp_path / "logs" / "up.json")} == {"stopped"}

        # 2. The stack restarted on the same data: the entry is still there.
        stack.start()
        assert stack.ask() == "exact"
        stopped = stack.component("transformer")
        stopped.suspend()  # SIGSTOP: its parent-death SIGTERM stays pending
        before = stack.processes()
        stack.kill_up()
        leftovers = [stopped]
        left = _gone([p for p in before if p.pid != stopped.pid])
        assert not left, f"left running after SIGKILL of semserve up: {left}"
        assert stopped.is_running()

        # 3. The next run stops the leftover it recorded, and says so.
        stack.start()
        text = stack.out.read_text()
        assert f"transformer (pid {stopped.pid}) running: stopping them" in text, text
        assert not _gone([stopped], 1)
        assert stack.ask() == "exact"
        before = stack.processes()
        assert stack.kill_up(signal.SIGHUP) == 0
        assert "==> stopping transformer" in stack.out.read_text()
        left = _gone(before)
        assert not left, f"left running after SIGHUP of semserve up: {left}"
    finally:
        if stack.up is not None and stack.up.poll() is None:
            stack.up.send_signal(signal.SIGTERM)
            stack.up.wait(90)
        for p in leftovers:
            if p.is_running():
                p.kill()
    # The predictor it was pointed at was never touched.
    assert httpx.get(f"{predictor.http}/v2/health/ready", timeout=5).status_code == 200


def _streamed_counts(base: str) -> tuple[list[int], float]:
    """The completion tokens so far at each content chunk of a 10-token streamed chat, and how many
    outputs the engine sent for it (the predictor's inter-token latency observations)."""
    itl = "semserve_predictor_inter_token_latency_seconds_count"
    before = metric_value(httpx.get(f"{base}/metrics", timeout=10).text, itl)
    body = {**CHAT, "max_tokens": 10, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    counts = []
    with httpx.stream("POST", f"{base}/openai/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    counts.append(chunk["usage"]["completion_tokens"])
    # The first output has no gap before it: outputs = observations + 1.
    return counts, metric_value(httpx.get(f"{base}/metrics", timeout=10).text, itl) - before + 1


@pytest.mark.timeout(1500)  # two engine starts (about 100 s each here, more on a loaded machine)
def test_a_killed_predictor_takes_its_engine_along(tmp_path: Path) -> None:
    """`semserve up` with its own predictor (the only component). The supervisor is frozen
    (SIGSTOP) while the predictor is SIGKILLed, so the engine must end by itself (lifeline's
    watch in vLLM's EngineCore and Workers), not by the supervisor's clean-up; resumed, the
    supervisor restarts the predictor, and no process of the first engine is left. Finally a
    SIGKILL of `semserve up` takes the new predictor and its engine along.

    The predictor runs with --stream-interval 3, so one streamed answer also shows that vLLM's
    engine takes the setting in this layout (the GPU's): it sends 3 tokens per output."""
    http, grpc = free_port(), free_port()
    stack = Stack(str(grpc), tmp_path, runs=1)
    argv = [
        sys.executable, "-m", "semserve", "up", "--without", "redis", "--without", "transformer",
        "--predictor-http-port", str(http), "--predictor-grpc-port", str(grpc),
        "--log-dir", str(tmp_path / "logs"), "--ready-timeout-s", "600",
    ]  # fmt: skip
    with stack.out.open("wb") as f:
        # Eager: an engine starts in about a third of the time, and what is checked here is
        # processes, not text. The engine core in a process of its own, as on GPU (on CPU it runs
        # in the predictor's process by default, and has nothing to outlive it).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SEMSERVE_PREDICTOR_ENFORCE_EAGER": "1",
               "SEMSERVE_PREDICTOR_ENGINE_IN_PROCESS": "0", "SEMSERVE_PREDICTOR_STREAM_INTERVAL": "3"}
        up = stack.up = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        stack.wait("predictor ready", lambda: "semserve is up." in stack.out.read_text(), 660)
        predictor = stack.component("predictor")
        first = predictor.children(recursive=True)
        names = {p.name() for p in first}
        assert any(n.startswith("VLLM::EngineCore") for n in names), names

        up.send_signal(signal.SIGSTOP)
        try:
            predictor.kill()
            left = _gone(first, 20)
            assert not left, f"engine processes outlived their predictor: {left}"
        finally:
            up.send_signal(signal.SIGCONT)
        stack.wait("predictor restarted",
                   lambda: "predictor ready again (restart 1)" in stack.out.read_text(), 600)  # fmt: skip
        second = stack.component("predictor")
        assert second.pid != predictor.pid
        assert any(p.name().startswith("VLLM::EngineCore") for p in second.children(recursive=True))
        counts, outputs = _streamed_counts(f"http://127.0.0.1:{http}")
        assert counts[-1] == 10 and all(b - a >= 3 for a, b in pairwise(counts)), counts
        assert outputs <= 4, outputs  # 1, 3, 3, 3: the engine's own outputs, before the edge groups them

        everything = stack.processes()
        assert stack.kill_up() == -signal.SIGKILL
        left = _gone(everything, 90)
        assert not left, f"left running after SIGKILL of semserve up: {left}"
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGCONT)
            up.send_signal(signal.SIGTERM)
            up.wait(120)
