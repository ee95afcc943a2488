"""`semserve bench coldstart --transformer-vs-kserve`: the transformer's start to ready against
`python -c "import kserve"`, alternated in one run (issue 28: at most 1.5x).

Each round runs both subjects back to back, in alternating order (so neither always comes second,
after the other has warmed the page cache): `python -c "import kserve"` with this interpreter, in
this venv and directory, timed from the fork to its exit; and `semserve transformer` on the
prepared embedder (what the image ships) with the embedded local Redis, timed from the fork to the
first 200 of /v2/health/ready (polled every 20 ms). The ratio is taken per round (the two starts of
a round see about the same machine load) and reported as the median and range of those ratios,
beside the ratio of the medians.

Phases come from the transformer's structured log (seconds from the fork): its imports (up to the
`transformer_settings` line), the embedder (its `embedder_ready` fields: tokenizer, ONNX session,
how long the start waited for the session loaded in a thread, the probe), the KServe app and gRPC
setup (`server_starting`), the HTTP bind (uvicorn's "running" line), then readiness. Redis is not on
that path: the cache connects and checks its index beside the servers (it fails open), so its cost
shows in the first answer, which is measured when `--seed-predictor` names a predictor to seed one
exact hit through: the first request after ready must then be that hit.

`--baseline-root NAME=DIR` (repeatable) adds a subject: the transformer run from another source
tree (e.g. `git archive` of an older commit, or this tree less one lever; same venv), for
before/after and per-lever figures in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import coldstart as cs

# Phases of the table, in start order: (name in Run.phases, what it is).
PHASES = [
    ("at.transformer_settings", "imports + settings (first line after the imports)"),
    ("embedder_ready.tokenizer_s", "embedder: tokenizer"),
    ("embedder_ready.session_s", "embedder: ONNX session (in a thread when preloaded)"),
    ("embedder_ready.preload_wait_s", "embedder: start waited for the preloading thread"),
    ("embedder_ready.probe_s", "embedder: probe forward"),
    ("at.embedder_ready", "embedder ready"),
    ("at.server_starting", "KServe app + gRPC built (`server_starting`)"),
    ("at.http_bound", "HTTP bound (uvicorn running)"),
]


@dataclass
class Round:
    index: int
    import_kserve_s: float
    transformer: cs.Run
    baselines: dict[str, cs.Run] = field(default_factory=dict)
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def ratio(self) -> float | None:
        ready = self.transformer.ready_s
        return ready / self.import_kserve_s if ready is not None else None


@dataclass
class Report:
    rounds: list[Round] = field(default_factory=list)

    def medians(self) -> dict[str, float | None]:
        def med(values: list[float | None]) -> float | None:
            vs = [v for v in values if v is not None]
            return statistics.median(vs) if vs else None

        names = dict.fromkeys(n for r in self.rounds for n in r.baselines)
        return {
            "import_kserve_s": med([r.import_kserve_s for r in self.rounds]),
            "transformer_ready_s": med([r.transformer.ready_s for r in self.rounds]),
            "ratio": med([r.ratio for r in self.rounds]),
            "first_answer_after_ready_s": med([r.transformer.answer_after_ready_s for r in self.rounds]),
            **{f"baseline.{n}.ready_s": med([r.baselines[n].ready_s if n in r.baselines else None
                                             for r in self.rounds]) for n in names},
        }


def _import_kserve() -> float:
    t = time.monotonic()
    subprocess.run([sys.executable, "-c", "import kserve"], check=True, cwd=cs.ROOT)
    return time.monotonic() - t


def _transformer_cmd(http: int, grpc: int, redis_url: str, predictor: str) -> list[str]:
    return [sys.executable, "-m", "semserve", "transformer", "--http-port", str(http),
            "--grpc-port", str(grpc), "--cache-redis-url", redis_url,
            "--cache-deployment", "transformer-start", "--predictor-host", predictor]


def _http_bound(run: cs.Run, log: Path, wall_start: float) -> None:
    """uvicorn's "running" line: the HTTP socket is bound and accepting."""
    from datetime import datetime

    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and "Uvicorn running" in line:
            ts = json.loads(line).get("ts", "")
            at = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() - wall_start
            run.phases["at.http_bound"] = round(at, 3)
            return


def _start_transformer(name: str, i: int, redis_url: str, seeded: bool,
                       root: Path = cs.ROOT) -> cs.Run:
    http, grpc = cs._free_port(), cs._free_port()
    base = f"http://127.0.0.1:{http}"
    # A closed predictor port: the start and its first answer must not need the predictor.
    cmd = _transformer_cmd(http, grpc, redis_url, f"127.0.0.1:{cs._free_port()}")
    log = cs.LOG_DIR / f"transformer-start-{name}-{i}.log"
    # Another tree finds the prepared embedder where this one keeps it (its own .cache/ is empty).
    env = None if root == cs.ROOT else {
        "SEMSERVE_CACHE_DIR": os.environ.get("SEMSERVE_CACHE_DIR", str(cs.ROOT / ".cache"))}
    started = cs._start(cmd, log, env=env, cwd=root)
    run = cs.Run(f"transformer ({name})", "warm", None, None, False)
    try:
        run.ready_s = cs._wait_ready(started, f"{base}/v2/health/ready", 120)
        if seeded:
            status = cs._v2_infer(base)
            if status != "exact":
                raise RuntimeError(f"first answer was {status!r}, not a cache hit")
            run.first_answer_s = time.monotonic() - started.mono_start
        run.ok = True
    except Exception as exc:
        run.error = str(exc)[:300]
    finally:
        cs._stop(started)
    run.phases = cs._log_events(started)
    _http_bound(run, log, started.wall_start)
    return run


def _seed(redis_url: str, predictor_grpc: str) -> None:
    """One miss through a real predictor stores the answer every measured start must hit."""
    http, grpc = cs._free_port(), cs._free_port()
    seeder = cs._start(_transformer_cmd(http, grpc, redis_url, predictor_grpc),
                       cs.LOG_DIR / "transformer-start-seed.log")
    try:
        cs._wait_ready(seeder, f"http://127.0.0.1:{http}/v2/health/ready", 120)
        print(f"  seed request: {cs._v2_infer(f'http://127.0.0.1:{http}')}", flush=True)
    finally:
        cs._stop(seeder)


def run_rounds(runs: int, seed_predictor: str = "", baselines: dict[str, Path] | None = None) -> Report:
    cs.LOG_DIR.mkdir(parents=True, exist_ok=True)
    # The prepared embedder a transformer image ships (a no-op when .cache/embedder has it).
    subprocess.run([sys.executable, "-m", "semserve", "embedder", "prepare"], check=True, cwd=cs.ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = Report()
    with cs._redis() as redis_url:
        if seed_predictor:
            _seed(redis_url, seed_predictor)
        for i in range(runs):
            load = os.getloadavg()
            steps: list[tuple[str, Any]] = [
                ("import", _import_kserve),
                ("transformer", lambda i=i: _start_transformer("this", i, redis_url, bool(seed_predictor))),
            ]
            for name, root in (baselines or {}).items():
                steps.append((f"baseline.{name}", lambda i=i, name=name, root=root: _start_transformer(
                    name, i, redis_url, bool(seed_predictor), root=root)))
            if i % 2:
                steps.reverse()
            got = {name: step() for name, step in steps}
            rnd = Round(i, got.pop("import"), got.pop("transformer"),
                        {k.removeprefix("baseline."): v for k, v in got.items()}, load)
            report.rounds.append(rnd)
            t = rnd.transformer
            others = "".join(f"  {n} {cs._fmt(b.ready_s)}" for n, b in rnd.baselines.items())
            print(f"  round {i}: import kserve {rnd.import_kserve_s:5.2f} s  transformer ready "
                  f"{cs._fmt(t.ready_s)}  ratio {_x(rnd.ratio)}{others}  load {load[0]:.1f}"
                  f"{'  ERROR ' + t.error if t.error else ''}", flush=True)
    return report


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _s(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def markdown(report: Report, runs: int) -> str:
    m = report.medians()
    ratios = [r.ratio for r in report.rounds if r.ratio is not None]
    loads = [r.loadavg[0] for r in report.rounds]
    imports = [r.import_kserve_s for r in report.rounds]
    readies = [r.transformer.ready_s for r in report.rounds if r.transformer.ready_s is not None]
    ratio_of_medians = (m["transformer_ready_s"] / m["import_kserve_s"]
                        if m["transformer_ready_s"] and m["import_kserve_s"] else None)
    rows = [
        f"## Transformer start vs `import kserve` ({time.strftime('%Y-%m-%d')}, "
        f"CPU, {os.cpu_count()} cores)",
        "",
        f"Command: `semserve bench coldstart --transformer-vs-kserve --runs {runs}`; rounds "
        f"alternate the order; 1-min load {min(loads):.1f}-{max(loads):.1f}.",
        "",
        "| subject | runs | median s | range s |",
        "| --- | --- | --- | --- |",
        f"| `python -c \"import kserve\"` | {len(imports)} | {_s(m['import_kserve_s'])} | "
        f"{_s(min(imports))}-{_s(max(imports))} |",
        f"| transformer start -> ready | {len(readies)} | {_s(m['transformer_ready_s'])} | "
        f"{_s(min(readies, default=None))}-{_s(max(readies, default=None))} |",
    ]
    for name in dict.fromkeys(n for r in report.rounds for n in r.baselines):
        vs = [r.baselines[name].ready_s for r in report.rounds
              if name in r.baselines and r.baselines[name].ready_s is not None]
        gain = [r.baselines[name].ready_s - r.transformer.ready_s for r in report.rounds
                if name in r.baselines and r.baselines[name].ready_s is not None
                and r.transformer.ready_s is not None]
        rows.append(f"| transformer from `{name}` -> ready (this tree's gain over it: median "
                    f"{_s(statistics.median(gain) if gain else None)} s) | {len(vs)} | "
                    f"{_s(m.get(f'baseline.{name}.ready_s'))} | "
                    f"{_s(min(vs, default=None))}-{_s(max(vs, default=None))} |")
    if m["first_answer_after_ready_s"] is not None:
        rows.append(f"| first exact hit after ready | {len(readies)} | "
                    f"{_s(m['first_answer_after_ready_s'])} | - |")
    rows += [
        "",
        f"Ratio (per round, transformer / import kserve): median **{_x(m['ratio'])}**, range "
        f"{_x(min(ratios, default=None))}-{_x(max(ratios, default=None))}; ratio of the medians "
        f"{_x(ratio_of_medians)}. Goal: at most 1.5x.",
        "",
        "Phases (medians, seconds; `at.` = from the fork):",
        "",
        "| phase | s |",
        "| --- | --- |",
    ]
    for key, label in PHASES:
        vals = [r.transformer.phases.get(key) for r in report.rounds]
        vs = [v for v in vals if v is not None]
        if vs:
            rows.append(f"| {label} (`{key}`) | {statistics.median(vs):.3f} |")
    rows.append(f"| ready (/v2/health/ready 200) | {_s(m['transformer_ready_s'])} |")
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    baselines: dict[str, Path] = {}
    for spec in args.baseline_root:
        name, _, root = spec.rpartition("=")
        path = Path(root).resolve()
        baselines[name or path.name] = path
    report = run_rounds(args.runs, args.seed_predictor, baselines)
    text = markdown(report, args.runs)
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "medians": report.medians(),
            "rounds": [{**asdict(r), "ratio": r.ratio} for r in report.rounds],
        }, indent=1, default=str))
    if args.output:
        with open(args.output, "a") as f:
            f.write(f"\n{text}\n")
    return 0 if all(r.transformer.ok for r in report.rounds) else 1
