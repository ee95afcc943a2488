"""The transformer's start stays lean: what it imports on the way to ready, that the embedder's session
is loaded beside the imports, and `semserve bench coldstart --transformer-vs-kserve` itself. How fast
the start is belongs to that bench (bench/RESULTS.md, "Transformer start"), never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.test_coldstart import log_events
from tests.support import ROOT, ServerProcess, free_port, http_ready

# Packages the transformer has no use for at start (or at all): each one was, or could easily
# become, seconds of a 2-core start. `openai` (and its HTTP clients) was ~0.9 s for ten response
# models (semserve/openai_wire.py); bench, serverless, predictors come with building every CLI command.
NOT_AT_START = {
    "torch", "vllm", "transformers", "sentence_transformers", "sklearn", "scipy", "matplotlib",
    "openai", "aiohttp", "onnx", "bench", "serverless", "predictors", "hypothesis", "pytest",
}


def test_transformer_start_imports_none_of_what_it_must_not(redis_url: str) -> None:
    """A real transformer (real Redis, the prepared embedder) started by the CLI, every import of its
    start logged until it is ready: none of NOT_AT_START, and the ONNX session was preloaded."""
    http, grpc = free_port(), free_port()
    log = ROOT / ".cache" / "test-logs" / f"transformer-start-imports-{http}.log"
    log.unlink(missing_ok=True)
    proc = ServerProcess(
        [
            "transformer", "--http-port", str(http), "--grpc-port", str(grpc),
            "--predictor-host", f"127.0.0.1:{free_port()}",  # closed: not needed to start
            "--cache-redis-url", redis_url, "--cache-deployment", "start-imports",
        ],
        log,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    ).start()
    try:
        proc.wait_until(http_ready(f"http://127.0.0.1:{http}/v2/health/ready"), 180, "transformer")
    finally:
        proc.stop()
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("import time:")
    }
    assert "kserve" in imported and "onnxruntime" in imported, sorted(imported)[:20]
    unwanted = sorted(m for m in imported if m.split(".")[0] in NOT_AT_START)
    assert not unwanted, unwanted[:20]
    [ready] = log_events(log, "embedder_ready")
    # Loaded in a thread while the service imported (cache.embedder.preload), from prepared files.
    assert ready["preloaded"] is True and ready["onnx_reused"] is True, ready
    assert ready["preload_wait_s"] >= 0 and ready["session_s"] > 0, ready


def test_service_commands_build_only_their_own_parser() -> None:
    # `semserve transformer` imports its command module alone, not bench/serverless/predictors'.
    probe = (
        "import contextlib, io, sys\n"
        "from semserve import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as help_text, contextlib.suppress(SystemExit):\n"
        "    cli.main(['transformer', '--help'])\n"
        "assert '--cache-redis-url' in help_text.getvalue()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'bench', 'serverless', 'predictors'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
    from semserve import cli

    for module in cli.SERVICE_COMMANDS.values():
        assert module in cli.COMMAND_MODULES, module


def test_bench_transformer_vs_kserve_smoke(tmp_path: Path) -> None:
    """One round of the bench: both subjects measured, the ratio is theirs, the phases are in order."""
    report = tmp_path / "start.json"
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "semserve", "bench", "coldstart", "--transformer-vs-kserve",
         "--runs", "1", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "Ratio (per round, transformer / import kserve)" in out.stdout, out.stdout[-3000:]
    data = json.loads(report.read_text())
    [rnd] = data["rounds"]
    ready, imported = rnd["transformer"]["ready_s"], rnd["import_kserve_s"]
    assert 0 < imported and 0 < ready < time.monotonic() - t, rnd
    assert abs(rnd["ratio"] - ready / imported) < 1e-9, rnd
    phases = rnd["transformer"]["phases"]
    order = ["at.transformer_settings", "at.embedder_ready", "at.server_starting", "at.http_bound"]
    at = [phases[k] for k in order]
    assert at == sorted(at) and at[-1] <= ready, phases
    assert phases["embedder_ready.session_s"] > 0 and "embedder_ready.preload_wait_s" in phases, phases
