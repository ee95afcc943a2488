"""`semserve bench determinism`: are temperature-0 answers the same solo and inside a batch?

The semantic cache stores whatever the predictor generated for a prompt; a user comparing a cached
answer with a fresh one sees a difference whenever greedy decoding depends on what else was in the
batch (floating-point reduction order changes with batch shape). This measures how often that
happens on this backend, with vLLM's prefix caching on (the predictor's default) and off, each engine
in its own process (one engine in memory at a time):

- solo vs batched: each probe prompt alone, then the same prompt among 56 others;
- solo vs solo after a batch: does a batch leave state (the prefix cache) that changes a solo answer;
- batched vs batched: the same batch twice, in another order.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from semserve import model_prep

PROBES = [
    "What is the capital of France?",
    "Name a bird.",
    "What is 2+2?",
    "Who wrote Hamlet?",
    "Give me a synonym for happy.",
    "What color is the sky?",
    "Translate 'cat' to Spanish.",
    "What is the largest planet?",
]
FILLERS = [f"Tell me a short fact about the number {i}." for i in range(56)]
MAX_TOKENS = 48


def _differ(a: list[str], b: list[str]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=True))


def measure(model_dir: Path, prefix_caching: bool) -> dict[str, Any]:
    """One engine: the three comparisons, as counts of probes whose text differed."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), gpu_memory_utilization=0.25, max_model_len=2048, max_num_seqs=64,
              enable_prefix_caching=prefix_caching, seed=0)  # fmt: skip
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    def run(prompts: list[str]) -> list[str]:
        chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]  # fmt: skip
        return [o.outputs[0].text for o in llm.generate(chats, params, use_tqdm=False)]

    half = len(FILLERS) // 2
    solo = [run([p])[0] for p in PROBES]
    batched = run(FILLERS[:half] + PROBES + FILLERS[half:])[half : half + len(PROBES)]
    solo_after = [run([p])[0] for p in PROBES]
    batched_again = run(PROBES + FILLERS)[: len(PROBES)]
    return {
        "prefix_caching": prefix_caching,
        "probes": len(PROBES),
        "solo_vs_batched": _differ(solo, batched),
        "solo_vs_solo_after_batch": _differ(solo, solo_after),
        "batched_vs_batched_reordered": _differ(batched, batched_again),
        "example": next(([s, b] for s, b in zip(solo, batched, strict=True) if s != b), None),
    }


def _run_worker(model_dir: Path, prefix_caching: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.determinism", "--worker", "--model", str(model_dir),
           "--prefix-caching", "on" if prefix_caching else "off"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{") and '"prefix_caching"' in ln]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"determinism worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def markdown(results: list[dict[str, Any]]) -> str:
    rows = [
        "| prefix caching | solo vs batched | solo vs solo after a batch | batch vs reordered batch |",
        "| --- | --- | --- | --- |",
    ]
    for r in results:
        n = r["probes"]
        rows.append(
            f"| {'on' if r['prefix_caching'] else 'off'} | {r['solo_vs_batched']}/{n} | "
            f"{r['solo_vs_solo_after_batch']}/{n} | {r['batched_vs_batched_reordered']}/{n} |"
        )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
    if args.worker:
        print(json.dumps(measure(model_dir, args.prefix_caching == "on")), flush=True)
        return 0
    results = []
    for on in (True, False):
        started = time.monotonic()
        mode = "on" if on else "off"
        print(f"determinism: engine with prefix caching {mode} (start ~30 s) ...", flush=True)
        results.append(_run_worker(model_dir, on))
        print(f"determinism: done in {time.monotonic() - started:.0f} s", flush=True)
    table = markdown(results)
    print(table)
    for r in results:
        if r["example"]:
            solo, batched = r["example"]
            print(f"example (prefix caching {'on' if r['prefix_caching'] else 'off'}):\n"
                  f"  solo:    {solo!r}\n  batched: {batched!r}")  # fmt: skip
            break
    if args.output:
        with open(args.output, "a") as f:
            f.write(table + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.determinism")
    add_arguments(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prefix-caching", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    p.add_argument("--output", default=None, help="append the markdown table to this file")


if __name__ == "__main__":  # vLLM's engine process is spawned: the worker needs this guard
    sys.exit(main(_parser().parse_args()))
