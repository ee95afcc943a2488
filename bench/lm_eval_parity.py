"""`semserve bench lm-eval`: lm-evaluation-harness's loglikelihood tasks against running servers,
each choice's loglikelihood compared with a reference server's (vLLM's own, first).

lm-eval's `local-completions` model scores a text with echo, logprobs 1, max_tokens 1 and
temperature 0: the server reports the prompt's tokens' logprobs, and lm-eval sums those of the
continuation and checks whether each was the most likely token (is_greedy). Two servers that
serve the same engine should give the same numbers, request by request; accuracy alone would hide a
difference that does not change the ranking.

lm-eval is no dependency of semserve (it pulls in datasets, evaluate, peft, ...). Install it in a
venv of its own that sees ours, so that it finds this torch and transformers and downloads no
other torch:

    python3 -m venv /tmp/lmeval
    echo "$PWD/.venv/lib/python3.11/site-packages" > "$(/tmp/lmeval/bin/python -c \
        'import site; print(site.getsitepackages()[0])')/semserve-venv.pth"
    /tmp/lmeval/bin/pip install lm_eval==0.4.13

The default task (bench/lm_eval/capitals.yaml) reads a local file: nothing comes from a hub.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS_DIR = ROOT / "bench" / "lm_eval"
OUT_DIR = ROOT / ".cache" / "bench-lm-eval"


@dataclass(frozen=True)
class Scored:
    """One loglikelihood request as lm-eval recorded it: the continuation's summed logprob, and
    whether each of its tokens was the most likely one."""

    loglikelihood: float
    is_greedy: bool


@dataclass(frozen=True)
class Run:
    """One target's run: its accuracy per task and its requests by (task, doc id, choice)."""

    name: str
    accuracy: dict[str, float]
    scored: dict[tuple[str, int, int], Scored]
    seconds: float


@dataclass(frozen=True)
class Parity:
    """A run against the reference run, request by request."""

    requests: int  # requests both runs scored
    identical: int  # loglikelihoods equal to the last bit
    max_abs_diff: float
    greedy_agree: int
    missing: int  # requests the reference scored and this run did not


def read_samples(path: Path, task: str) -> dict[tuple[str, int, int], Scored]:
    """lm-eval's samples file (`--log_samples`): each doc's `filtered_resps`, a
    [loglikelihood, is_greedy] pair per choice (written as strings by some versions)."""
    out: dict[tuple[str, int, int], Scored] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        sample = json.loads(line)
        for choice, (loglikelihood, greedy) in enumerate(sample["filtered_resps"]):
            out[(task, int(sample["doc_id"]), choice)] = Scored(float(loglikelihood), _bool(greedy))
    return out


def _bool(value: object) -> bool:
    return value if isinstance(value, bool) else str(value) == "True"


Requests = dict[tuple[str, int, int], Scored]


def compare(reference: Requests, other: Requests) -> Parity:
    both = [k for k in reference if k in other]
    diffs = [abs(reference[k].loglikelihood - other[k].loglikelihood) for k in both]
    return Parity(
        requests=len(both),
        identical=sum(d == 0.0 for d in diffs),
        max_abs_diff=max(diffs, default=0.0),
        greedy_agree=sum(reference[k].is_greedy == other[k].is_greedy for k in both),
        missing=len(reference) - len(both),
    )


def table(runs: list[Run]) -> str:
    reference = runs[0]
    lines = [
        f"| target | accuracy | seconds | requests | identical to {reference.name} | max abs diff | "
        "is_greedy agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        acc = ", ".join(f"{task} {value:.3f}" for task, value in sorted(run.accuracy.items()))
        p = compare(reference.scored, run.scored)
        missing = f" ({p.missing} missing)" if p.missing else ""
        lines.append(f"| {run.name} | {acc} | {run.seconds:.1f} | {p.requests}{missing} | {p.identical} | "
                     f"{p.max_abs_diff:.2e} | {p.greedy_agree} |")  # fmt: skip
    return "\n".join(lines)


def parse_target(text: str) -> tuple[str, str]:
    """NAME=URL (an OpenAI completions URL, e.g. http://127.0.0.1:8090/openai/v1/completions)."""
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"a target is NAME=URL of a completions route, got {text!r}")
    return name, url


def _run(
    lm_eval: str, name: str, url: str, tasks: list[str], tokenizer: Path, concurrent: int, tokenized: bool
) -> Run:
    out = OUT_DIR / name
    shutil.rmtree(out, ignore_errors=True)
    # tokenized_requests: lm-eval sends token ids (its default) or text.
    model_args = (f"model=llm,base_url={url},tokenizer={tokenizer},tokenized_requests={tokenized},"
                  f"num_concurrent={concurrent},max_retries=1")  # fmt: skip
    cmd = [lm_eval, "--model", "local-completions", "--model_args", model_args, "--tasks", ",".join(tasks),
           "--include_path", str(TASKS_DIR), "--log_samples", "--output_path", str(out)]  # fmt: skip
    print(f"==> {name}: {url}", flush=True)
    started = time.monotonic()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - started
    [results] = glob.glob(str(out / "*" / "results_*.json"))
    reported = json.loads(Path(results).read_text())["results"]
    accuracy = {task: float(metrics["acc,none"]) for task, metrics in reported.items()}
    scored: dict[tuple[str, int, int], Scored] = {}
    for task in tasks:
        [samples] = glob.glob(str(out / "*" / f"samples_{task}_*.jsonl"))
        scored |= read_samples(Path(samples), task)
    return Run(name, accuracy, scored, seconds)


def main(args: argparse.Namespace) -> int:
    from semserve import model_prep

    lm_eval = shutil.which(args.lm_eval) or (args.lm_eval if Path(args.lm_eval).exists() else None)
    if lm_eval is None:
        print(f"no lm_eval at {args.lm_eval!r}: install it as bench/lm_eval_parity.py says", file=sys.stderr)
        return 2
    tokenizer = Path(args.tokenizer) if args.tokenizer else model_prep.prepare().model_dir
    tasks = args.tasks.split(",")
    runs = [_run(lm_eval, name, url, tasks, tokenizer, args.concurrent, args.tokenized)
            for name, url in args.target]  # fmt: skip
    text = table(runs)
    print()
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            f.write(f"\n{text}\n")
    return 0
