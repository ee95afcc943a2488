"""Server processes of the benches: a `python -m semserve ...` child with its log in a file, and
the stop and readiness waits the benches share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.predictor import ROOT, pinned

LOG_DIR = ROOT / ".cache" / "bench-logs"


def parse_cpus(spec: str) -> frozenset[int]:
    """`0`, `0,2` or `0-3` (as taskset -c takes them) -> the CPU numbers."""
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"CPU list {spec!r}: expected numbers and ranges such as 0 or 0,2 or 0-3")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


@dataclass(frozen=True)
class CoreSplit:
    """The engines (our predictor, vLLM's server) on some CPUs, the transformer, Redis and the
    bench's clients on the others: the shape of a deployment, where the transformer is a pod of
    its own, on one machine. Without it every process shares every CPU, and the transformer's work
    slows the engine (whose threads wait for each other at every step) beside measuring itself."""

    engine: frozenset[int]
    rest: frozenset[int]

    @classmethod
    def of(cls, engine_cpus: str, allowed: frozenset[int] | None = None) -> CoreSplit:
        allowed = allowed if allowed is not None else frozenset(os.sched_getaffinity(0))
        engine = parse_cpus(engine_cpus)
        if not engine <= allowed:
            raise ValueError(
                f"engine CPUs {sorted(engine)} are not all among this process's {sorted(allowed)}"
            )
        rest = allowed - engine
        if not rest:
            raise ValueError(f"engine CPUs {sorted(engine)} leave none of {sorted(allowed)} for the rest")
        return cls(engine, rest)

    @classmethod
    def from_flag(cls, engine_cpus: str | None) -> CoreSplit | None:
        """`--engine-cpus` as the benches take it: None when not given; a bad list ends the bench
        with its message (exit 2), before anything starts."""
        if not engine_cpus:
            return None
        try:
            return cls.of(engine_cpus)
        except ValueError as e:
            raise SystemExit(f"--engine-cpus: {e}") from None

    def pin_this_process(self) -> None:
        """This process, and every child it starts from now on unless told otherwise, on `rest`."""
        os.sched_setaffinity(0, self.rest)

    def describe(self) -> str:
        return (f"engines on CPUs {_cpu_list(self.engine)}, transformer, Redis and clients on "
                f"{_cpu_list(self.rest)}")


def _cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


class Proc:
    """A `python -m semserve ...` child (or another module's) with its log in a file: start now,
    wait for ready later. `cpus`: the CPUs it runs on (default: its parent's)."""

    def __init__(
        self, name: str, args: list[str], ready_url: str, log: Path, module: str = "semserve",
        cpus: frozenset[int] | None = None,
    ) -> None:  # fmt: skip
        self.name, self.args, self.ready_url, self.log, self.module = name, args, ready_url, log, module
        self.cpus = cpus
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.start_s = float("nan")

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args], stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True, preexec_fn=pinned(self.cpus),
        )
        return self

    def wait_ready(self, timeout_s: float = 900) -> float:
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(self.ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            waited = time.monotonic() - self.started
            if waited > timeout_s:
                raise TimeoutError(f"{self.name} not ready in {timeout_s:.0f} s; see {self.log}")
            if sys.stdout.isatty():
                print(f"  [{self.name}] starting... {waited:.0f}s", end="\r", flush=True)
            elif int(waited) % 30 == 0:
                print(f"  [{self.name}] starting... {waited:.0f}s", flush=True)
            time.sleep(1)
        self.start_s = time.monotonic() - self.started
        print(f"  [{self.name}] ready in {self.start_s:.0f}s            ", flush=True)
        return self.start_s

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (started with start_new_session), SIGKILL after 60 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_http(url: str, timeout_s: float) -> None:
    """Poll `url` until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")
