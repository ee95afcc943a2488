"""The sleep tier on a real GPU (issue 28 item 4), one run: `bench/gpu-check.sh` calls it after the
benchmark; alone:

    python bench/gpu_sleep_check.py --model DIR [--idle-s 10] [--output bench/RESULTS.md]

Starts `semserve predictor --sleep-after-idle-s IDLE` on DIR and checks, printing each figure:
the state route says awake; a temperature-0 completion; after the idle window the engine sleeps by
itself (state route, `semserve_predictor_sleep_state` 1, GPU memory used before and after); the same
completion wakes it and gives the same text, with its wake time (state route and
`semserve_predictor_wake_seconds`); POST /admin/sleep and /admin/wake do the same on demand. Exits 1
on the first check that fails, 2 when the predictor refuses to start (on CPU: vLLM's CPU backend has
no sleep mode, and the predictor says so within seconds).
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The three primary colours are"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpu_memory_mib() -> str:
    if shutil.which("nvidia-smi") is None:
        return "-"
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "-"


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


class Check:
    def __init__(self, log: Path) -> None:
        self.rows: list[tuple[str, str]] = []
        self.log = log

    def record(self, what: str, value: object) -> None:
        self.rows.append((what, str(value)))
        print(f"  {what}: {value}", flush=True)

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            print(f"FAILED: {what}; the predictor's log ends:", flush=True)
            print(self.log.read_text(errors="replace")[-4000:], flush=True)
            raise SystemExit(1)


def run(model: str, idle_s: float, output: Path | None) -> int:
    port = _free_port()
    log = Path("/tmp/semserve-gpu-sleep-check.log")
    cmd = [sys.executable, "-m", "semserve", "predictor", "--model", model, "--http-port", str(port),
           "--grpc-port", "0", "--sleep-after-idle-s", str(idle_s)]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    check = Check(log)
    try:
        with httpx.Client(base_url=base, timeout=120) as http:
            started = time.monotonic()
            while True:
                if proc.poll() is not None:
                    print(log.read_text(errors="replace")[-3000:])
                    return 2
                try:
                    if http.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - started > 1800:
                    print("predictor not ready after 30 min")
                    return 1
                time.sleep(1)
            check.record("start to ready (s)", round(time.monotonic() - started, 1))

            def complete() -> tuple[str, float]:
                t = time.monotonic()
                r = http.post("/openai/v1/completions", json={"model": "llm", "prompt": PROMPT,
                              "max_tokens": 16, "temperature": 0})  # fmt: skip
                check.require(r.status_code == 200, f"completion answered {r.status_code}: {r.text}")
                return r.json()["choices"][0]["text"], time.monotonic() - t

            def state() -> dict:
                r = http.get("/admin/sleep")
                check.require(r.status_code == 200, f"GET /admin/sleep answered {r.status_code}")
                return r.json()

            check.require(state()["state"] == "awake" and state()["sleep_mode"] is True, "awake at start")
            text, seconds = complete()
            check.record("completion while awake (s)", round(seconds, 3))
            check.record("GPU memory used, awake", _gpu_memory_mib())
            deadline = time.monotonic() + idle_s + 30
            while state()["state"] != "asleep":
                check.require(time.monotonic() < deadline, f"asleep within {idle_s + 30:g} s of idle")
                time.sleep(0.5)
            metrics = http.get("/metrics").text
            check.require(_metric(metrics, "semserve_predictor_sleep_state") == 1.0, "sleep_state metric 1")
            check.record("GPU memory used, asleep", _gpu_memory_mib())
            again, seconds = complete()
            check.record("completion that woke the engine (s)", round(seconds, 3))
            check.require(again == text, f"same text after the wake: {text!r} vs {again!r}")
            st = state()
            check.require(st["state"] == "awake" and st["wakes"] == 1, f"awake once: {st}")
            check.record("wake (s, state route)", st["last_wake_s"])
            metrics = http.get("/metrics").text
            wakes = _metric(metrics, "semserve_predictor_wake_seconds_count")
            check.require(wakes == 1.0, f"one wake counted, not {wakes}")
            check.require(_metric(metrics, "semserve_predictor_sleep_state") == 0.0, "sleep_state metric 0")
            r = http.post("/admin/sleep")
            check.require(r.status_code == 200 and r.json()["state"] == "asleep", f"admin sleep: {r.text}")
            r = http.post("/admin/wake")
            check.require(r.status_code == 200 and r.json()["state"] == "awake", f"admin wake: {r.text}")
            check.record("admin wake (s)", r.json()["last_wake_s"])
            check.require(complete()[0] == text, "same text after the admin wake")
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("sleep tier: all checks passed")
    if output is not None:
        title = f"## Sleep tier on a GPU ({time.strftime('%Y-%m-%d')}, bench/gpu_sleep_check.py)"
        table = ["| check | value |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in check.rows)]
        lines = ["", title, "", *table, ""]
        with output.open("a") as f:
            f.write("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF model directory")
    p.add_argument("--idle-s", type=float, default=10.0, help="the predictor's --sleep-after-idle-s")
    p.add_argument("--output", type=Path, default=None, help="append the figures to this markdown file")
    args = p.parse_args(argv)
    return run(args.model, args.idle_s, args.output)


if __name__ == "__main__":
    sys.exit(main())
