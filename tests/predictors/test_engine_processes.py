"""The processes a predictor's engine runs in (predictors/config.py `engine_in_process`,
`inline_worker`). On CPU, by default, vLLM's engine core runs in the predictor's own process (no
child process at all). Otherwise (on GPU, or `--no-engine-in-process`) the engine core has a process
of its own, and the model worker has one too unless `--inline-worker` puts it inside the engine core.
Checked on the suite's predictor, whatever its settings say in its log; the other mode's processes
are checked by tests/semserve/test_up_lifecycle.py's killed-predictor test."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import urlparse

import psutil

from tests.conftest import Predictor
from tests.support import ROOT, free_port


def _engine_starting(predictor: Predictor) -> dict[str, object]:
    lines = predictor.process.log_path.read_text(errors="replace").splitlines()
    found = [json.loads(line) for line in lines if line.startswith("{") and '"engine_starting"' in line]
    assert found, "no engine_starting line"
    return found[-1]  # type: ignore[no-any-return]


def _predictor_pid(predictor: Predictor) -> int:
    if predictor.process.proc is not None:
        return predictor.process.proc.pid
    port = urlparse(predictor.http).port  # a running predictor (SEMSERVE_TEST_PREDICTOR): by its port
    [pid] = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
             and c.status == psutil.CONN_LISTEN}
    assert pid is not None
    return pid


def test_engine_processes_follow_the_settings(predictor: Predictor) -> None:
    starting = _engine_starting(predictor)
    assert isinstance(starting.get("engine_in_process"), bool), starting
    assert isinstance(starting.get("inline_worker"), bool), starting
    children = psutil.Process(_predictor_pid(predictor)).children(recursive=True)
    titles = [" ".join(p.cmdline()) for p in children]
    cores = [t for t in titles if t.startswith("VLLM::EngineCore")]
    workers = [t for t in titles if t.startswith("VLLM::Worker")]
    if starting["engine_in_process"]:
        assert not cores and not workers, titles
        return
    assert len(cores) == 1, titles
    assert len(workers) == (0 if starting["inline_worker"] else 1), titles


def test_the_engine_runs_in_the_predictors_process_on_cpu_by_default(predictor: Predictor) -> None:
    """The suite runs on CPU with the defaults (or an environment that says otherwise)."""
    import os

    starting = _engine_starting(predictor)
    if os.environ.get("SEMSERVE_PREDICTOR_ENGINE_IN_PROCESS", "1").lower() in ("0", "false"):
        assert starting["engine_in_process"] is False, starting
    else:
        assert starting["gpu"] is False and starting["engine_in_process"] is True, starting


def test_a_negative_kv_cache_size_is_refused_before_the_engine_loads() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "semserve", "predictor", "--http-port", str(free_port()),
         "--grpc-port", "0", "--kv-cache-gib", "-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = out.stdout + out.stderr
    assert out.returncode != 0 and "kv_cache_gib -1.0: must be >= 0" in output, output
    assert "engine_starting" not in output, output
