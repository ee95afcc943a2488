"""`semserve bench coldstart --variant NAME=FLAGS ...`: predictor start levers, each alone, in one run.

Every start here is meant to be a warm one, on a private copy of a filled compile cache
(`--cache-from`, by default `$SEMSERVE_CACHE_DIR`): vLLM's own server, our predictor with its
defaults (the baseline), then each variant (the baseline plus that variant's flags), round after
round. A start that adds files to that copy compiled what it lacked (e.g. vLLM's own server at
flags the cache was never filled with): it is marked and left out of the medians. While a server is up
it also gets, after its first answer:
- a fixed prompt set at temperature 0 (`TEXT_PROMPTS`): its texts must equal the baseline's;
- `semserve bench predictor`'s load at small settings (streamed chat, ignore_eos, fixed length):
  tokens/s, compared with vLLM's own server's in the same round.

The phases come from our `engine_ready` line and from vLLM's own log lines: when each vLLM process
logged first (vLLM's own server, VLLM_CONFIGURE_LOGGING=1), weight loading, compiled-graph loading,
the engine core's "init engine (profile, create kv cache, warmup model)" (our predictor logs these
lines as its own, in JSON, as it does in production: the variable is part of vLLM's AOT cache key).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench import coldstart as cs
from bench.predictor import _level

TEXT_PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nExplain how a refrigerator works.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
]
TEXT_TOKENS = 48
LOAD = {"concurrency": 4, "requests": 16, "max_tokens": 32}

# vLLM's own start lines -> a phase name (seconds, as vLLM reports them).
VLLM_PHASES = [
    (re.compile(r"Loading weights took ([\d.]+) seconds"), "vllm.load_weights_s"),
    (re.compile(r"from the cache, took ([\d.]+) s"), "vllm.load_compiled_graphs_s"),
    (re.compile(r"torch\.compile took ([\d.]+) s in total"), "vllm.torch_compile_s"),
    (re.compile(r"Initial profiling/warmup run took ([\d.]+) s"), "vllm.profile_run_s"),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
     "vllm.init_engine_s"),
]
VLLM_LINE = re.compile(r"\((\w+?)(?:_DP\d+)? pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class Trial:
    name: str  # vllm | baseline | a variant's name
    round: int
    ready_s: float | None
    ok: bool
    texts: list[str] = field(default_factory=list)
    tokens_per_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    error: str = ""
    # Files the start added to the compile cache: > 0 means it compiled what the copied cache
    # lacked, so it was not a warm start (left out of the medians while a warm one exists).
    cache_writes: int = 0

    @property
    def warm(self) -> bool:
        return self.cache_writes == 0


def vllm_phases(log: Path, wall_start: float) -> dict[str, float]:
    """vLLM's own phase lines, and seconds from process start to each vLLM process's first line
    (`at.vllm.<process>`: 1 s resolution, vLLM logs whole seconds)."""
    out: dict[str, float] = {}
    year = datetime.fromtimestamp(wall_start).year
    for line in log.read_text(errors="replace").splitlines():
        m = VLLM_LINE.search(line)
        if m:
            at = datetime.strptime(f"{year}-{m.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp() - wall_start
            out.setdefault(f"at.vllm.{m.group(1)}", round(at, 1))
        for pattern, name in VLLM_PHASES:
            found = pattern.search(line)
            if found:
                out[name] = round(out.get(name, 0.0) + float(found.group(1)), 2)
    return out


def complete(url: str, prompt: str) -> str:
    body = {"model": "llm", "prompt": prompt, "max_tokens": TEXT_TOKENS, "temperature": 0}
    resp = httpx.post(url, json=body, timeout=300)
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["text"])


@dataclass
class _Named:
    name: str


class Levers:
    def __init__(self, bench: cs.Bench, args: Any) -> None:
        self.bench, self.args = bench, args
        self.variants: list[tuple[str, list[str]]] = []
        for spec in args.variant:
            name, _, flags = spec.partition("=")
            self.variants.append((name, shlex.split(flags)))
        self.trials: list[Trial] = []

    def _caches(self) -> Path:
        """A private copy of a filled compile cache, laid out as `_cache_env` expects."""
        from predictors.warm_start import CACHE_VARS, cache_root

        src = Path(self.args.cache_from) if self.args.cache_from else cache_root()
        dst = self.bench.scratch / "caches"
        for name, sub in CACHE_VARS.items():
            if (src / sub).is_dir():
                shutil.copytree(src / sub, dst / name.lower(), dirs_exist_ok=True)
        return dst

    def one(self, name: str, rnd: int, extra: list[str] | None, root: Path) -> Trial:
        http, grpc = cs._free_port(), cs._free_port()
        if extra is None:
            cmd, ready, first = self.bench._vllm_cmd(http)
            base = first.rsplit("/completions", 1)[0]
        else:
            cmd, ready, first = self.bench._predictor_cmd(http, grpc)
            cmd += extra
            base = first.rsplit("/completions", 1)[0]
        env = cs._cache_env(root)
        if extra is None:
            # vLLM's own log format, for its processes' first lines (`at.vllm.*`). Not for ours:
            # our predictor logs vLLM's lines as its own, and vLLM keys its AOT compile cache by
            # its environment, this variable included, so the start must see what a warm-up saw.
            env["VLLM_CONFIGURE_LOGGING"] = "1"
        log = cs.LOG_DIR / f"lever-{name}-{rnd}.log"
        files_before = cache_files(root)
        run, started = cs._measure(name, "warm", cmd, ready, lambda: cs._first_token(first, "llm"),
                                   log, env=env, keep=True)
        trial = Trial(name, rnd, run.ready_s, run.ok, error=run.error,
                      cache_writes=cache_files(root) - files_before)
        if not trial.warm:
            print(f"    not warm: it wrote {trial.cache_writes} files to the compile cache", flush=True)
        if started is None:
            trial.phases = run.phases
            return trial
        try:
            trial.texts = [complete(first, p) for p in TEXT_PROMPTS]
            result = asyncio.run(_level(_Named(name), f"{base}/chat/completions", "llm", **LOAD))
            trial.tokens_per_s = result.tokens_per_s
            print(f"    tokens/s {result.tokens_per_s:.1f} ({result.errors} errors)", flush=True)
        except Exception as exc:
            trial.ok, trial.error = False, str(exc)[:300]
        finally:
            cs._stop(started)
        trial.phases = {**run.phases, **vllm_phases(log, started.wall_start)}
        return trial

    def run(self) -> int:
        root = self._caches()
        cs.LOG_DIR.mkdir(parents=True, exist_ok=True)
        subjects: list[tuple[str, list[str] | None]] = [("vllm", None), ("baseline", [])]
        subjects += [(n, f) for n, f in self.variants]
        try:
            for rnd in range(self.args.predictor_runs):
                for name, extra in subjects:
                    self.trials.append(self.one(name, rnd, extra, root))
        finally:
            shutil.rmtree(self.bench.scratch, ignore_errors=True)
        print()
        print(self.report())
        return 0 if all(t.ok for t in self.trials) else 1

    def report(self) -> str:
        def med(values: Any) -> float | None:
            vs = [v for v in values if v is not None]
            return statistics.median(vs) if vs else None

        ran = {name: [t for t in self.trials if t.name == name and t.ok] for name in dict.fromkeys(
            t.name for t in self.trials)}
        by = {name: warm_or_all(group) for name, group in ran.items()}
        vllm_ready = med(t.ready_s for t in by.get("vllm", []))
        vllm_tps = med(t.tokens_per_s for t in by.get("vllm", []))
        base_texts = next((t.texts for t in by.get("baseline", []) if t.texts), [])
        rows = [
            f"Levers ({time.strftime('%Y-%m-%d %H:%M')}, {cs._machine()}): warm starts, "
            f"{self.args.predictor_runs} round(s); variants: "
            + ", ".join(f"`{n}` = `{' '.join(f)}`" for n, f in self.variants),
            "",
            "| subject | runs | ready s (each) | / vLLM's | tokens/s | / vLLM's | text = baseline | "
            "text = vLLM |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, group in by.items():
            ready = med(t.ready_s for t in group)
            tps = med(t.tokens_per_s for t in group)
            each = ", ".join(_each(t) for t in ran[name] if t.ready_s is not None)
            same_base = all(t.texts == base_texts for t in group) if base_texts else None
            vllm_texts = next((t.texts for t in by.get("vllm", []) if t.texts), [])
            same_vllm = all(t.texts == vllm_texts for t in group) if vllm_texts else None
            rows.append(
                f"| {name} | {len(group)} | {_f(ready)} ({each}) | {_ratio(ready, vllm_ready)} | "
                f"{_f(tps)} | {_ratio(tps, vllm_tps)} | {_yn(same_base)} | {_yn(same_vllm)} |"
            )
        rows += ["", "| subject | phase | seconds (median) |", "| --- | --- | --- |"]
        for name, group in by.items():
            for phase in dict.fromkeys(p for t in group for p in t.phases):
                if phase.startswith("at.") and not (phase.startswith("at.vllm.") or phase[3:] in
                                                    cs.PHASE_EVENTS):
                    continue
                rows.append(f"| {name} | {phase} | {_f(med(t.phases.get(phase) for t in group))} |")
        if any(not t.warm for t in self.trials):
            rows.append("\n(*) the start wrote files to the compile cache, so it compiled what the copied "
                        "cache lacked: not a warm start, left out of the medians and the phases when "
                        "the subject has a warm one.")
        failed = [t for t in self.trials if not t.ok]
        rows += [f"\nFailed: {t.name} round {t.round}: {t.error}" for t in failed]
        return "\n".join(rows)


def cache_files(root: Path) -> int:
    """Files under the private compile cache (what a start that compiles adds to)."""
    from predictors.warm_start import count_files

    return count_files([root])


def warm_or_all(trials: list[Trial]) -> list[Trial]:
    """The warm starts of one subject, or all of them when none was warm (the table marks them)."""
    warm = [t for t in trials if t.warm]
    return warm or trials


def _each(t: Trial) -> str:
    return f"{t.ready_s:.1f}" + ("" if t.warm else f"* ({t.cache_writes} files)")


def _f(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "no")


def main(args: Any) -> int:
    """`semserve bench coldstart`: the levers with --variant, else the cold/warm start bench."""
    args.predictor_runs = args.predictor_runs or args.runs
    if args.transformer_vs_kserve:
        from bench import transformer_start

        return transformer_start.main(args)
    if args.variant:
        return Levers(cs.Bench(args), args).run()
    return cs.Bench(args).run()


# What the engine core in this very process would give (vLLM's LLMEngine with
# VLLM_ENABLE_V1_MULTIPROCESSING=0: InprocClient, no engine-core or worker process). AsyncLLM has no
# such mode in vLLM 0.32 ("Running EngineCore in asyncio without multiprocessing is not currently
# supported"), so the predictor cannot use it as is; this measures the start it would have.
INPROC_PROBE = """
import os, sys, time
t0 = float(sys.argv[2])
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from predictors.warm_start import use_cache_dirs
use_cache_dirs()
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine
t_import = time.time() - t0
engine = LLMEngine.from_engine_args(EngineArgs(
    model=sys.argv[1], served_model_name=["llm"], max_model_len=2048, max_num_seqs=64,
    gpu_memory_utilization=0.25))
t_engine = time.time() - t0
engine.add_request("probe", {"prompt": sys.argv[3]}, SamplingParams(max_tokens=4, temperature=0))
while not any(out.outputs[0].token_ids for out in engine.step()):
    pass
print(f"INPROC import {t_import:.2f} engine_ready {t_engine:.2f} first_token {time.time() - t0:.2f}")
"""


def inproc_probe(model_dir: Path, root: Path) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, **cs._cache_env(root), "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-c", INPROC_PROBE, str(model_dir), str(time.time()),
                          cs.PROMPT], cwd=cs.ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("INPROC")]
    return lines[-1] if lines else f"failed ({out.returncode}): {out.stderr[-500:]}"


if __name__ == "__main__":
    # `python -m bench.startup_levers`: the in-process probe alone, on a copy of .cache/'s caches.
    import tempfile
    from types import SimpleNamespace

    from semserve import model_prep

    scratch = Path(tempfile.mkdtemp(prefix="semserve-inproc-"))
    try:
        bench = SimpleNamespace(scratch=scratch)
        root = Levers(bench, SimpleNamespace(variant=[], cache_from=""))._caches()  # type: ignore[arg-type]
        print(inproc_probe(model_prep.prepare().model_dir, root), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
