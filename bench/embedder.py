"""Embedder backends side by side: single-prompt p50/p99, batch-16 latency, cosine to eager torch.

    .venv/bin/python -m bench.embedder [--iters 100] [--threads 2] [--backends torch,onnx-int8]

Kept short on purpose (the machine is shared); numbers are wall-clock on whatever cores we get.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence

from cache.embedder import Embedder
from cache.settings import BACKENDS, EmbedderSettings

PROMPTS = [
    "How do I reset my password?",
    "What's the capital of Australia?",
    "Write a python function that reverses a linked list",
    "Can I take ibuprofen with paracetamol?",
    "cheapest flights from Paris to Rome in May",
    "Explain the difference between a Roth IRA and a traditional IRA",
    "how long should I boil an egg for a runny yolk",
    "Why is the sky blue?",
    "cancel my subscription please, I was charged twice this month and want a refund",
    "What does HTTP status code 429 mean and how should a client back off?",
    "Translate 'good morning' into Japanese",
    "Summarize the causes of the First World War in three sentences",
    "My docker container exits immediately with code 137, what does that mean?",
    "Is it safe to eat raw cookie dough?",
    "convert 350 fahrenheit to celsius",
    "Give me a 3-day itinerary for Lisbon on a budget",
]


def _time(fn: Callable[[], object], iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def bench(backends: Sequence[str], iters: int, threads: int, max_length: int) -> list[dict[str, float | str]]:
    """All backends are loaded first and then measured in interleaved rounds, so load from other
    processes on a shared machine hits every backend alike."""
    embedders = [
        Embedder(EmbedderSettings(backend=b, threads=threads, max_length=max_length, lru_size=0))
        for b in backends
    ]
    ref = embedders[0].embed_many(PROMPTS, batch_size=1)
    cos = [(e.embed_many(PROMPTS, batch_size=1) * ref).sum(axis=1) for e in embedders]
    for e in embedders:  # warm-up
        e.embed_many(PROMPTS[:4], batch_size=1)
    single: list[list[float]] = [[] for _ in embedders]
    batch: list[list[float]] = [[] for _ in embedders]
    rounds = max(1, iters // 20)
    for r in range(rounds):
        for k, e in enumerate(embedders):
            for i in range(20):
                text = PROMPTS[(r * 20 + i) % len(PROMPTS)]
                single[k].extend(_time(lambda e=e, text=text: e.embed_many([text]), 1))
            batch[k].extend(_time(lambda e=e: e.embed_many(PROMPTS, batch_size=16), 2))
    rows: list[dict[str, float | str]] = []
    for k, e in enumerate(embedders):
        rows.append(
            {
                "backend": e.backend,
                "p50_ms": statistics.median(single[k]),
                "p99_ms": _pct(single[k], 0.99),
                "batch16_ms": statistics.median(batch[k]),
                "min_cos": float(cos[k].min()),
                "mean_cos": float(cos[k].mean()),
            }
        )
    base = rows[0]
    for row in rows:
        row["p50_x"] = float(base["p50_ms"]) / float(row["p50_ms"])
        row["batch16_x"] = float(base["batch16_ms"]) / float(row["batch16_ms"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="torch,torch-int8,onnx,onnx-int8,onnx-int8-block")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; one of {BACKENDS}")
    rows = bench(backends, args.iters, args.threads, args.max_length)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"threads={args.threads} max_length={args.max_length} iters={args.iters} "
        f"(ratios vs {rows[0]['backend']})"
    )
    print(
        f"{'backend':<11} {'p50 ms':>7} {'p99 ms':>7} {'b16 ms':>7} {'p50 x':>6} {'b16 x':>6} {'min cos':>8}"
    )
    for r in rows:
        print(
            f"{r['backend']:<11} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} {r['batch16_ms']:7.2f} "
            f"{r['p50_x']:6.2f} {r['batch16_x']:6.2f} {r['min_cos']:8.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
