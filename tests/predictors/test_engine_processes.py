"""The processes a predictor's engine runs in (predictors/config.py `inline_worker`): vLLM's engine
core always has a process of its own; the model worker has one too unless `--inline-worker` puts it
inside the engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0, one process fewer to start). Checked on
the suite's predictor, whatever its setting says in its log."""

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


def test_engine_processes_follow_the_inline_worker_setting(predictor: Predictor) -> None:
    starting = _engine_starting(predictor)
    assert isinstance(starting.get("inline_worker"), bool), starting
    children = psutil.Process(_predictor_pid(predictor)).children(recursive=True)
    titles = [" ".join(p.cmdline()) for p in children]
    cores = [t for t in titles if t.startswith("VLLM::EngineCore")]
    workers = [t for t in titles if t.startswith("VLLM::Worker")]
    assert len(cores) == 1, titles
    assert len(workers) == (0 if starting["inline_worker"] else 1), titles


def test_a_negative_kv_cache_size_is_refused_before_the_engine_loads() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "semserve", "predictor", "--http-port", str(free_port()),
         "--grpc-port", "0", "--kv-cache-gib", "-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = out.stdout + out.stderr
    assert out.returncode != 0 and "kv_cache_gib -1.0: must be >= 0" in output, output
    assert "engine_starting" not in output, output
