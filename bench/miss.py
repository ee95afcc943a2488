"""`semserve bench miss`: what the transformer adds to a miss that is not streamed (issue 26 item 4).

For each protocol, v2 REST (/v2/models/llm/infer) and OpenAI chat (/openai/v1/chat/completions,
not streamed), N requests through the transformer and N straight to the predictor, strictly
alternated (ours, direct, ours, direct, ...) at concurrency 1, so load from other work on the machine
hits both alike. Every prompt is fresh (a random case number), so every transformer request is a
real miss (exact read, embedding, KNN, verifier, predictor, store); answers through the transformer
that are not `miss` are counted and left out. Small max_tokens: the generation is the same work on
both sides, its size only adds noise.

    .venv/bin/semserve bench miss --samples 200 --output bench/RESULTS.md
    .venv/bin/semserve bench miss --predictor http://127.0.0.1:18080,127.0.0.1:18081   # running one
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cache_clients import MODEL, cache_status
from bench.cache_e2e import miss_prompts
from bench.predictor import _free_port, _machine, _percentile
from bench.procs import LOG_DIR, CoreSplit, Proc

PROTOCOLS = ("v2", "openai")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=200, help="requests per side and protocol (alternated)")
    p.add_argument("--max-tokens", type=int, default=4, help="max_tokens of every request")
    p.add_argument("--warmup", type=int, default=4, help="warm-up requests per side and protocol")
    p.add_argument("--predictor", default=None, metavar="HTTP_URL,GRPC_ADDR",
                   help="use this running predictor instead of starting one")
    p.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    p.add_argument("--seed", type=int, default=0, help="random seed (miss prompts)")
    p.add_argument("--output", default=None, help="append the markdown section to this file")
    p.add_argument(
        "--engine-cpus", default=None, metavar="LIST",
        help="run the predictor this bench starts on these CPUs (taskset syntax: 0 or 0-3) and the "
        "transformer, Redis and the clients on the others, as when the transformer is a pod of its "
        "own (with --predictor: start that one on these CPUs yourself, `taskset -c LIST`)",
    )


@dataclass
class Side:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: int = 0

    @property
    def p50(self) -> float:
        return _percentile(self.latencies_ms, 0.5)

    @property
    def p99(self) -> float:
        return _percentile(self.latencies_ms, 0.99)


@dataclass
class Pair:
    protocol: str
    ours: Side = field(default_factory=Side)
    direct: Side = field(default_factory=Side)


async def call(http: httpx.AsyncClient, base: str, protocol: str, prompt: str, max_tokens: int) -> str:
    """One request; returns the cache status (`direct` from the predictor)."""
    if protocol == "v2":
        body = {
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": max_tokens, "temperature": 0},
        }
        return cache_status(await http.post(f"{base}/v2/models/{MODEL}/infer", json=body))
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    r = await http.post(f"{base}/openai/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
    r.json()  # the client parses the answer, on both sides
    return r.headers.get("x-semserve-cache", "direct")


async def _one(side: Side, expected: str, http: httpx.AsyncClient, base: str, protocol: str, prompt: str,
               max_tokens: int) -> None:  # fmt: skip
    t = time.perf_counter()
    try:
        status = await call(http, base, protocol, prompt, max_tokens)
    except Exception as e:
        side.errors += 1
        if side.errors <= 3:
            print(f"    error ({protocol}, {base}): {e!r}"[:300], flush=True)
        return
    ms = (time.perf_counter() - t) * 1000.0
    side.statuses[status] += 1
    if status == expected:
        side.latencies_ms.append(ms)


async def alternated(transformer: str, predictor: str, samples: int, max_tokens: int, warmup: int,
                     rng: random.Random) -> list[Pair]:  # fmt: skip
    pairs: list[Pair] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for protocol in PROTOCOLS:
            for prompt in miss_prompts(warmup, rng):  # connections, the embedder's first runs
                await _one(Side(), "miss", http, transformer, protocol, prompt, max_tokens)
                await _one(Side(), "direct", http, predictor, protocol, prompt, max_tokens)
            pair = Pair(protocol)
            for i, prompt in enumerate(miss_prompts(2 * samples, rng)):
                if i % 2 == 0:
                    await _one(pair.ours, "miss", http, transformer, protocol, prompt, max_tokens)
                else:
                    await _one(pair.direct, "direct", http, predictor, protocol, prompt, max_tokens)
            pairs.append(pair)
            ours, direct = pair.ours.p50, pair.direct.p50
            print(f"  {protocol:<6} ours p50 {ours:7.2f} ms  direct p50 {direct:7.2f} ms  "
                  f"diff {ours - direct:+.2f} ms  ratio {ours / direct:.3f}x  "
                  f"(n {len(pair.ours.latencies_ms)}/{len(pair.direct.latencies_ms)}, statuses "
                  f"{dict(pair.ours.statuses)}, errors {pair.ours.errors}/{pair.direct.errors})", flush=True)
    return pairs


def table(pairs: Sequence[Pair]) -> str:
    lines = ["| protocol | ours (miss) p50 / p99 ms | direct p50 / p99 ms | ours - direct p50 | ratio "
             "| n ours / direct | not a miss |",
             "|---|---|---|---|---|---|---|"]
    for p in pairs:
        name = "v2 REST" if p.protocol == "v2" else "OpenAI chat (not streamed)"
        lines.append(
            f"| {name} | {p.ours.p50:.1f} / {p.ours.p99:.1f} | {p.direct.p50:.1f} / {p.direct.p99:.1f} | "
            f"{p.ours.p50 - p.direct.p50:+.1f} ms | {p.ours.p50 / p.direct.p50:.3f}x | "
            f"{len(p.ours.latencies_ms)} / {len(p.direct.latencies_ms)} | "
            f"{sum(n for s, n in p.ours.statuses.items() if s != 'miss')} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from semserve import model_prep
    from semserve.tooling.local_redis import RedisServer

    started, load_start = time.monotonic(), os.getloadavg()[0]
    rng = random.Random(args.seed)
    split = CoreSplit.from_flag(args.engine_cpus)
    if split is not None:
        split.pin_this_process()  # the transformer and Redis it starts inherit it
        print(f"==> {split.describe()}" + (" (the running predictor: as it was started)" if args.predictor
                                            else ""), flush=True)  # fmt: skip
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    redis_dir = Path(tempfile.mkdtemp(prefix="redis-miss-bench-", dir=LOG_DIR))
    redis = RedisServer(_free_port(), data_dir=redis_dir)
    p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
    shared = args.predictor.split(",") if args.predictor else None
    pred_http = shared[0].rstrip("/") if shared else f"http://127.0.0.1:{p_http}"
    pred_grpc = shared[1] if shared else f"127.0.0.1:{p_grpc}"
    predictor = None
    if not shared:
        model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
        predictor = Proc(
            "predictor",
            ["predictor", "--model", str(model_dir), "--http-port", str(p_http), "--grpc-port", str(p_grpc),
             "--max-num-seqs", "8", "--max-model-len", "2048", "--log-level", "warning"],
            f"{pred_http}/v2/health/ready", LOG_DIR / "miss-bench-predictor.log",
            cpus=split.engine if split is not None else None,
        )
    transformer = Proc(
        "transformer",
        ["transformer", "--http-port", str(t_http), "--grpc-port", str(t_grpc), "--predictor-host", pred_grpc,
         "--cache-redis-url", "REDIS", "--cache-deployment", "bench_miss", "--log-level", "warning"],
        f"http://127.0.0.1:{t_http}/v2/health/ready", LOG_DIR / "miss-bench-transformer.log",
    )
    try:
        redis.start()
        transformer.args[transformer.args.index("REDIS")] = redis.url
        if predictor is not None:
            predictor.start()
            predictor.wait_ready()
        transformer.start()
        transformer.wait_ready(300)
        print(f"==> {args.samples} misses and {args.samples} direct requests per protocol, alternated, "
              f"max_tokens {args.max_tokens}", flush=True)
        pairs = asyncio.run(alternated(f"http://127.0.0.1:{t_http}", pred_http, args.samples,
                                       args.max_tokens, args.warmup, rng))
    finally:
        transformer.stop()
        if predictor is not None:
            predictor.stop()
        redis.stop()
    text = table(pairs)
    minutes = (time.monotonic() - started) / 60
    print()
    print(text)
    if args.output:
        cmd = f"semserve bench miss --samples {args.samples} --max-tokens {args.max_tokens}"
        if shared:
            cmd += f" --predictor {args.predictor}"
        if split is not None:
            cmd += f" --engine-cpus {args.engine_cpus}"
        cores = f" Cores: {split.describe()}." if split is not None else " Cores: every process on every CPU."
        with open(args.output, "a") as f:
            f.write(
                f"\n## Issue 26: miss overhead, not streamed ({time.strftime('%Y-%m-%d')}, {_machine()})\n\n"
                f"Command: `{cmd}` ({minutes:.1f} min). Concurrency 1, ours and direct strictly "
                f"alternated, fresh prompts (every transformer request a real miss), temperature 0. "
                f"The machine is shared with other work (1-min load average {load_start:.1f} at the "
                f"start, {os.getloadavg()[0]:.1f} at the end): the figures carry that noise."
                f"{cores}\n\n{text}\n"
            )
        print(f"appended to {args.output}")
    return 1 if any(p.ours.errors or p.direct.errors for p in pairs) else 0
