"""`semserve bench coldstart`: from process start to ready to the first answer, cold and warm.

What a user waits for after a scale-to-zero idle spell, minus scheduling and image pull: each
subject is started as a fresh process, readiness is polled from the moment of the fork (every
20 ms), and the first request is sent the moment it says ready. Subjects, one after the other
(side by side they would be each other's noise):

- `import-kserve`: `python -c "import kserve"`, the reference for the transformer's goal (2x).
- `kserve-floor`: a bare `kserve.ModelServer` with a trivial model; first answer = its predict.
- `transformer`: `semserve transformer`; first answer = an exact cache hit (v2 REST). Cold: an
  empty embedder cache (the ONNX export runs at start); warm: the files of `semserve embedder
  prepare`, what the image ships.
- `predictor`: `semserve predictor`; first answer = the first streamed token. Cold: empty vLLM /
  Inductor / Triton cache directories; warm: the directories a previous start filled.
- `vllm`: vLLM's own `python -m vllm.entrypoints.openai.api_server`, same model, limits and caches.

The transformer's hit is seeded once through a real predictor (the last predictor run's server, or
one started for it), so every measured transformer start answers from Redis with no predictor.
Medians over N runs; every run's figures and the phases from its log go to the JSON report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.predictor import _free_port, _machine
from semserve import model_prep

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / ".cache" / "bench-logs" / "coldstart"
POLL_S = 0.02
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
SUBJECTS = ("import-kserve", "kserve-floor", "transformer", "predictor", "vllm")
# The engine limits both LLM servers start with (ours' defaults, passed to vLLM's explicitly).
ENGINE_ARGS = ["--max-model-len", "2048", "--max-num-seqs", "64"]
CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

FLOOR_SERVER = """
import sys
import kserve

class Trivial(kserve.Model):
    def __init__(self):
        super().__init__("trivial")
        self.ready = True

    async def predict(self, payload, headers=None, response_headers=None):
        return {"predictions": [1]}

kserve.ModelServer(http_port=int(sys.argv[1]), grpc_port=int(sys.argv[2])).start([Trivial()])
"""


@dataclass
class Run:
    subject: str
    cache: str  # cold | warm | - (no cache involved)
    ready_s: float | None  # process start -> readiness 200
    first_answer_s: float | None  # process start -> first answer (hit / first token)
    ok: bool
    phases: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def answer_after_ready_s(self) -> float | None:
        if self.ready_s is None or self.first_answer_s is None:
            return None
        return self.first_answer_s - self.ready_s


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    wall_start: float
    mono_start: float
    log: Path


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Started:
    log.parent.mkdir(parents=True, exist_ok=True)
    wall, mono = time.time(), time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    return Started(proc, wall, mono, log)


def _stop(s: Started) -> None:
    if s.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s.proc.pid, signal.SIGTERM)
        try:
            s.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait(10)


def _wait_ready(s: Started, url: str, timeout_s: float) -> float:
    """Seconds from process start until `url` answers 200 (polled every 20 ms)."""
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() - s.mono_start < timeout_s:
            if s.proc.poll() is not None:
                raise RuntimeError(f"exited with {s.proc.returncode}; see {s.log}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return time.monotonic() - s.mono_start
            time.sleep(POLL_S)
    raise TimeoutError(f"not ready after {timeout_s:.0f} s; see {s.log}")


def _first_token(url: str, model: str) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.Client(timeout=120) as client, client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            raise RuntimeError(f"first token: HTTP {resp.status_code} {resp.text[:200]}")
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    return
    raise RuntimeError("first token: the stream ended without text")


def _v2_infer(base: str, max_tokens: int = 8) -> str:
    """One temperature-0 v2 request to the transformer; its cache status."""
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "parameters": {"max_tokens": max_tokens, "temperature": 0},
    }
    resp = httpx.post(f"{base}/v2/models/llm/infer", json=body, timeout=120,
                      headers={"content-type": "application/json"})
    if resp.status_code != 200:
        raise RuntimeError(f"v2 infer: HTTP {resp.status_code} {resp.text[:200]}")
    outputs = {o["name"]: o["data"] for o in resp.json()["outputs"]}
    return str(outputs["cache_status"][0])


def _log_events(s: Started) -> dict[str, float]:
    """Seconds from process start to each of our structured log events (first occurrence), and the
    numeric fields of the lines that report phases."""
    out: dict[str, float] = {}
    try:
        lines = s.log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        event, ts = rec.get("event"), rec.get("ts")
        if not event or not ts:
            continue
        at = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() - s.wall_start
        out.setdefault(f"at.{event}", round(at, 3))
        if event in ("embedder_ready", "engine_ready"):
            for k, v in rec.items():
                if k.endswith("_s") and isinstance(v, int | float):
                    out.setdefault(f"{event}.{k}", float(v))
    return out


def _measure(subject: str, cache: str, cmd: list[str], ready_url: str, answer: Callable[[], None],
             log: Path, env: dict[str, str] | None = None, timeout_s: float = 900,
             keep: bool = False) -> tuple[Run, Started | None]:
    s = _start(cmd, log, env)
    run = Run(subject, cache, None, None, False)
    try:
        run.ready_s = _wait_ready(s, ready_url, timeout_s)
        answer()
        run.first_answer_s = time.monotonic() - s.mono_start
        run.ok = True
    except Exception as exc:
        run.error = str(exc)[:300]
    finally:
        if not keep or not run.ok:
            _stop(s)
    run.phases = _log_events(s)
    print(f"  {subject:13} {cache:4}  ready {_fmt(run.ready_s)}  first answer {_fmt(run.first_answer_s)}"
          f"{'  ERROR ' + run.error if run.error else ''}", flush=True)
    return run, (s if keep and run.ok else None)


def _fmt(v: float | None) -> str:
    return f"{v:7.2f} s" if v is not None else "      - "


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    from semserve.tooling.local_redis import RedisServer

    server = RedisServer(_free_port(), data_dir=LOG_DIR / "redis").start()
    try:
        yield server.url
    finally:
        server.stop()


def _cache_env(root: Path) -> dict[str, str]:
    from predictors.warm_start import engine_env

    # Both LLM servers get the same cache directories and the same cache-relevant vLLM settings.
    return {**engine_env(), **{name: str(root / name.lower()) for name in CACHE_VARS}}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
        self.runs: list[Run] = []
        self.scratch = Path(tempfile.mkdtemp(prefix="semserve-coldstart-"))

    def _predictor_cmd(self, http: int, grpc: int) -> tuple[list[str], str, str]:
        cmd = [sys.executable, "-m", "semserve", "predictor", "--model", str(self.model_dir),
               "--http-port", str(http), "--grpc-port", str(grpc), *ENGINE_ARGS]
        base = f"http://127.0.0.1:{http}"
        return cmd, f"{base}/v2/health/ready", f"{base}/openai/v1/completions"

    def _vllm_cmd(self, http: int) -> tuple[list[str], str, str]:
        util = "0.25" if _machine().startswith("CPU") else "0.90"  # what our predictor picks
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", "llm", "--host", "127.0.0.1", "--port", str(http),
               "--gpu-memory-utilization", util, *ENGINE_ARGS]
        base = f"http://127.0.0.1:{http}"
        return cmd, f"{base}/health", f"{base}/v1/completions"

    def import_kserve(self) -> None:
        for _ in range(self.args.runs):
            t = time.monotonic()
            subprocess.run([sys.executable, "-c", "import kserve"], check=True, cwd=ROOT)
            s = time.monotonic() - t
            self.runs.append(Run("import-kserve", "-", s, s, True))
            print(f"  import-kserve -     {s:7.2f} s", flush=True)

    def kserve_floor(self) -> None:
        script = self.scratch / "floor.py"
        script.write_text(FLOOR_SERVER)
        for i in range(self.args.runs):
            http, grpc = _free_port(), _free_port()
            base = f"http://127.0.0.1:{http}"

            def answer(base: str = base) -> None:
                r = httpx.post(f"{base}/v1/models/trivial:predict", json={"instances": [[1]]}, timeout=30)
                r.raise_for_status()

            run, _ = _measure("kserve-floor", "-", [sys.executable, str(script), str(http), str(grpc)],
                              f"{base}/v2/health/ready", answer, LOG_DIR / f"floor-{i}.log")
            self.runs.append(run)

    def llm_server(self, subject: str, runs: int) -> Started | None:
        """Cold runs (each on fresh cache dirs), then warm runs on the last cold run's dirs. With
        `keep_last`, the last warm run's server is left running and returned (to seed the hit)."""
        kept: Started | None = None
        root = self.scratch
        for cache in ("cold", "warm"):
            for i in range(runs):
                if cache == "cold":
                    root = self.scratch / f"{subject}-cache-{i}"
                    shutil.rmtree(root, ignore_errors=True)
                http, grpc = _free_port(), _free_port()
                if subject == "predictor":
                    cmd, ready, first = self._predictor_cmd(http, grpc)
                else:
                    cmd, ready, first = self._vllm_cmd(http)
                keep = subject == "predictor" and cache == "warm" and i == runs - 1
                run, started = _measure(
                    subject, cache, cmd, ready, lambda first=first: _first_token(first, "llm"),
                    LOG_DIR / f"{subject}-{cache}-{i}.log", env=_cache_env(root), keep=keep,
                )
                self.runs.append(run)
                if started is not None:
                    kept = started
                    self.seed_grpc = f"127.0.0.1:{grpc}"
        return kept

    def transformer(self, redis_url: str, seed_grpc: str) -> None:
        prepared = self.scratch / "embedder-prepared"
        subprocess.run([sys.executable, "-m", "semserve", "embedder", "prepare",
                        "--embed-onnx-dir", str(prepared)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def cmd(http: int, grpc: int, onnx_dir: Path, predictor: str) -> list[str]:
            return [sys.executable, "-m", "semserve", "transformer", "--http-port", str(http),
                    "--grpc-port", str(grpc), "--cache-redis-url", redis_url,
                    "--cache-deployment", "coldstart", "--predictor-host", predictor,
                    "--embed-onnx-dir", str(onnx_dir)]

        # Seed: one miss through the real predictor stores the answer every measured start hits.
        http, grpc = _free_port(), _free_port()
        seeder = _start(cmd(http, grpc, prepared, seed_grpc), LOG_DIR / "transformer-seed.log")
        try:
            _wait_ready(seeder, f"http://127.0.0.1:{http}/v2/health/ready", 300)
            status = _v2_infer(f"http://127.0.0.1:{http}")
            print(f"  transformer seed request: {status}", flush=True)
        finally:
            _stop(seeder)
        for cache in ("cold", "warm"):
            for i in range(self.args.runs):
                onnx_dir = self.scratch / f"embedder-cold-{i}" if cache == "cold" else prepared
                http, grpc = _free_port(), _free_port()
                base = f"http://127.0.0.1:{http}"

                def answer(base: str = base) -> None:
                    status = _v2_infer(base)
                    if status != "exact":
                        raise RuntimeError(f"first answer was {status!r}, not a cache hit")

                # The predictor address is a closed port: a hit must not need it.
                closed = f"127.0.0.1:{_free_port()}"
                run, _ = _measure("transformer", cache, cmd(http, grpc, onnx_dir, closed),
                                  f"{base}/v2/health/ready", answer, LOG_DIR / f"transformer-{cache}-{i}.log")
                self.runs.append(run)

    def run(self) -> int:
        only = set(self.args.only.split(",")) if self.args.only else set(SUBJECTS)
        self.seed_grpc = ""
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        try:
            if "import-kserve" in only:
                print("==> python -c 'import kserve'", flush=True)
                self.import_kserve()
            if "kserve-floor" in only:
                print("==> bare kserve.ModelServer, trivial model", flush=True)
                self.kserve_floor()
            if "vllm" in only:
                print("==> vLLM's own OpenAI server", flush=True)
                self.llm_server("vllm", self.args.predictor_runs)
            seeder: Started | None = None
            if "predictor" in only:
                print("==> semserve predictor", flush=True)
                seeder = self.llm_server("predictor", self.args.predictor_runs)
            if "transformer" in only:
                if self.args.seed_predictor:
                    self.seed_grpc = self.args.seed_predictor
                elif seeder is None:
                    print("==> a predictor to seed the transformer's cache hit", flush=True)
                    http, grpc = _free_port(), _free_port()
                    cmd, ready, _ = self._predictor_cmd(http, grpc)
                    seeder = _start(cmd, LOG_DIR / "predictor-seed.log")
                    _wait_ready(seeder, ready, 900)
                    self.seed_grpc = f"127.0.0.1:{grpc}"
                print("==> semserve transformer", flush=True)
                with _redis() as redis_url:
                    try:
                        self.transformer(redis_url, self.seed_grpc)
                    finally:
                        if seeder is not None:
                            _stop(seeder)
            elif seeder is not None:
                _stop(seeder)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        report = self.report()
        print()
        print(report)
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(
                {"machine": _machine(), "runs": [{**asdict(r), "answer_after_ready_s": r.answer_after_ready_s}
                                                 for r in self.runs]}, indent=1))
        if self.args.output:
            with open(self.args.output, "a") as f:
                f.write(f"\n{report}\n")
        return 0 if all(r.ok for r in self.runs) else 1

    def report(self) -> str:
        rows = [
            f"## Cold starts ({time.strftime('%Y-%m-%d')}, {_machine()})",
            "",
            f"Command: `semserve bench coldstart --runs {self.args.runs} --predictor-runs "
            f"{self.args.predictor_runs}`. Medians, seconds from process start.",
            "",
            "| subject | caches | runs | ready | first answer | answer after ready |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for key in dict.fromkeys((r.subject, r.cache) for r in self.runs):
            group = [r for r in self.runs if (r.subject, r.cache) == key and r.ok]
            failed = sum(1 for r in self.runs if (r.subject, r.cache) == key and not r.ok)
            rows.append(
                f"| {key[0]} | {key[1]} | {len(group)}{f' ({failed} failed)' if failed else ''} | "
                f"{_median(r.ready_s for r in group)} | {_median(r.first_answer_s for r in group)} | "
                f"{_median(r.answer_after_ready_s for r in group)} |"
            )
        phases = self.phase_rows()
        if phases:
            rows += ["", "Phases (medians; `at.EVENT`: seconds from process start to that log line):", "",
                     "| subject | caches | phase | seconds |", "| --- | --- | --- | --- |", *phases]
        return "\n".join(rows)

    def phase_rows(self) -> list[str]:
        rows = []
        for key in dict.fromkeys((r.subject, r.cache) for r in self.runs):
            group = [r for r in self.runs if (r.subject, r.cache) == key and r.ok and r.phases]
            names = dict.fromkeys(n for r in group for n in r.phases)
            for name in names:
                if name.startswith("at.") and name[3:] not in PHASE_EVENTS:
                    continue
                median = _median(r.phases.get(name) for r in group)
                rows.append(f"| {key[0]} | {key[1]} | {name} | {median} |")
        return rows


# Log events worth a row in the phase table (others stay in the JSON report).
PHASE_EVENTS = {
    "transformer_settings", "embedder_onnx_export", "embedder_ready", "server_starting",
    "engine_compile_cache", "engine_starting", "engine_ready",
}


def _median(values: Any) -> str:
    vs = [v for v in values if v is not None]
    return f"{statistics.median(vs):.2f}" if vs else "-"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="starts per subject and cache state")
    parser.add_argument("--predictor-runs", type=int, default=0,
                        help="starts per LLM server and cache state (0: --runs); each is ~1-2 min on CPU")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SUBJECTS)}")
    parser.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    parser.add_argument("--json", default=None, help="write every run (and its phases) to this file")
    parser.add_argument("--seed-predictor", default="", metavar="HOST:PORT",
                        help="a running predictor's gRPC address for the transformer's one seeding miss "
                        "(default: the last predictor run, or one started for it)")
    parser.add_argument("--output", default=None, help="append the markdown tables to this file")
    # Start levers (bench/startup_levers.py, which `semserve bench coldstart` runs when --variant is
    # given): warm starts only, vLLM's server vs ours vs variants.
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="a predictor variant: the baseline plus FLAGS (repeatable); measures warm "
                        "starts, texts at temperature 0 and tokens/s against vLLM's own server")
    parser.add_argument("--cache-from", default="", metavar="DIR",
                        help="with --variant: copy the filled compile caches from DIR "
                        "(default $SEMSERVE_CACHE_DIR, .cache/)")
    # The transformer's start against `import kserve` (bench/transformer_start.py).
    parser.add_argument("--transformer-vs-kserve", action="store_true",
                        help="only this: `python -c 'import kserve'` and a warm transformer start, "
                        "alternated --runs times in one run; their ratio (goal <= 1.5x) and the start's "
                        "phases (with --seed-predictor, also the first exact hit after ready)")
    parser.add_argument("--baseline-root", action="append", default=[], metavar="[NAME=]DIR",
                        help="with --transformer-vs-kserve: also start the transformer from the source "
                        "tree DIR (e.g. `git archive` of an older commit; same venv) in every round "
                        "(repeatable)")


def main(args: argparse.Namespace) -> int:
    args.predictor_runs = args.predictor_runs or args.runs
    return Bench(args).run()
