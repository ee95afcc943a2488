"""`semserve bench ...`: benchmarks that print ratios against a peer measured in the same run."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmarks (ratios against peers)")
    bench_sub = parser.add_subparsers(dest="bench_command", required=True)
    pred = bench_sub.add_parser("predictor", help="our predictor vs vLLM's own OpenAI server")
    pred.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    pred.add_argument("--requests-per-level", type=int, default=0, help="0: 4 x concurrency, min 8")
    pred.add_argument("--max-tokens", type=int, default=64)
    pred.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    pred.add_argument("--output", default=None, help="append the markdown table to this file")
    pred.add_argument("--profile", default=None, help="write the engine profile JSON for simulate")
    pred.set_defaults(func=_predictor)


def _predictor(args: argparse.Namespace) -> int:
    from bench.predictor import main

    return main(args)
