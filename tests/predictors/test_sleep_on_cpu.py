"""The sleep tier on this CPU machine, with real processes: vLLM's CPU backend has no sleep mode, so
the setting is refused at start (in seconds, before any engine loads) and the admin routes of a
running predictor answer 409 saying why. The GPU path is bench/gpu-check.sh's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from semserve import sleep_mode
from tests.conftest import Predictor
from tests.support import ROOT, free_port


def _predictor(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "semserve", "predictor", "--http-port", str(free_port()),
         "--grpc-port", "0", *args],
        cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def test_cpu_refuses_the_sleep_setting_before_the_engine_loads() -> None:
    for args, env in (
        (("--sleep-after-idle-s", "300"), None),
        ((), {"SEMSERVE_PREDICTOR_SLEEP_AFTER_IDLE_S": "30"}),
    ):
        code, output, seconds = _predictor(*args, env=env)
        assert code != 0, output
        assert sleep_mode.CPU_REFUSAL in output, output
        # Refused before the engine: no engine log line, and well under an engine start (~65 s).
        assert "engine_starting" not in output and "engine_compile_cache" not in output, output
        assert seconds < 45, f"took {seconds:.1f} s"


def test_sleep_level_2_and_negative_seconds_are_refused() -> None:
    code, output, _ = _predictor("--sleep-after-idle-s", "60", "--sleep-level", "2")
    assert code != 0 and "only level 1 is supported" in output, output
    code, output, _ = _predictor("--sleep-after-idle-s", "-5")
    assert code != 0 and "must be >= 0" in output, output


def test_admin_routes_answer_409_on_cpu_and_the_state_metric_reads_awake(predictor: Predictor) -> None:
    with httpx.Client(base_url=predictor.http, timeout=30) as http:
        state = http.get("/admin/sleep")
        assert state.status_code == 200, state.text
        body = state.json()
        assert body["sleep_mode"] is False and body["state"] == "awake"
        assert sleep_mode.CPU_NO_SLEEP in body["why"]
        for path in ("/admin/sleep", "/admin/wake"):
            answer = http.post(path)
            assert answer.status_code == 409, (path, answer.text)
            assert sleep_mode.CPU_NO_SLEEP in answer.json()["error"]
        text = http.get("/metrics").text
        assert 'semserve_predictor_sleep_state{model_name="llm"} 0.0' in text
        assert 'semserve_predictor_wake_seconds_count{model_name="llm"} 0.0' in text


def test_the_gpu_sleep_check_stops_at_the_refusal_on_cpu(tmp_path: Path) -> None:
    """bench/gpu_sleep_check.py (run by bench/gpu-check.sh on a GPU) here ends at the predictor's
    refusal, with exit status 2 and the reason, in seconds."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "bench/gpu_sleep_check.py", "--model", str(tmp_path), "--idle-s", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert sleep_mode.CPU_REFUSAL in proc.stdout
    assert time.monotonic() - started < 60
