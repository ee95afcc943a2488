"""A py-spy profile of the transformer serving semantic hits (issue 26 item 5).

Starts a Redis and a transformer (`--embed-lru-size 0`, so each hit embeds its prompt) in front of a
predictor (a running one with --predictor, else its own), stores the stored side of same-answer
eval pairs, keeps the paraphrases the transformer answers as semantic hits, then drives those hits
(v2 REST, concurrency 1, one httpx client) for 2 x --seconds while py-spy samples the transformer:
first an SVG flame graph, then raw folded stacks that are summed per part of the request
(embed, redis, KNN, verify, kserve/fastapi, middleware, ...) into milliseconds per hit.

    .venv/bin/python -m bench.profile_hit --predictor http://127.0.0.1:18080,127.0.0.1:18081 \\
        --name before --results bench/RESULTS.md

Writes bench/profile-semantic-hit-<name>.svg and .txt (the folded stacks). Milliseconds are
sampled time per hit summed over the transformer's threads (the embedder's thread counts too), so a
part that runs beside another is counted in both; idle threads are not sampled.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from bench.cache_clients import Clients, Target
from bench.predictor import ROOT, _free_port, _machine
from bench.procs import LOG_DIR, Proc

# The first rule (in order) that matches any frame of a stack, from the innermost frame out, names
# the part the sample belongs to. Patterns are matched against "function (file:line)" strings.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("embed (tokenize, ONNX forward, pooling)", ("cache/embedder", "onnxruntime", "tokenizers")),
    ("embed hand-off (batcher, thread wake-up)", ("cache/embed_batcher", "concurrent/futures")),
    ("verify", ("cache/verify", "cache/scorer", "cache/pairfeatures", "cache/judge_step")),
    ("KNN (FT.SEARCH, reply parsing)", ("cache/search_reply", "knn", "ft_search", "FT.SEARCH")),
    ("redis client (exact read, commands)",
     ("redis/", "cache/redis_client", "cache/store", "cache/redis_spans")),
    ("cache lookup logic (semantic_cache, keys, answer)", ("cache/",)),
    ("metrics, logs, tracing", ("prometheus_client", "opentelemetry", "semserve/logs", "semserve/tracing",
                                "logging/", "structlog")),
    ("answer pipeline, model (transformers_svc)", ("transformers_svc/answer", "transformers_svc/model",
                                                   "transformers_svc/pipeline")),
    ("middleware (transformers_svc, semserve)", ("middleware", "transformers_svc/", "semserve/http_limits",
                                                 "semserve/serving")),
    ("v2 protocol (semserve/v2, kserve protocol)", ("semserve/v2", "kserve/protocol", "kserve/model")),
    ("kserve / fastapi / starlette", ("kserve/", "fastapi/", "starlette/", "pydantic")),
    ("JSON (orjson, json)", ("orjson", "json/")),
    ("uvicorn / httptools / h11", ("uvicorn/", "httptools", "h11/")),
    ("grpc", ("grpc/",)),
    # py-spy does not see a thread in epoll_wait as idle when the loop polls with a timeout: waiting.
    ("event loop waiting in epoll (idle)", ("EpollSelector.select",)),
    ("asyncio event loop (socket writes, wake-ups, callbacks)", ("asyncio/",)),
)


def part_of(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, patterns in PARTS:
            if any(p in frame for p in patterns):
                return name
    return "other"


def aggregate(folded: Iterable[str]) -> Counter[str]:
    """Samples per part from py-spy's raw (folded) output: `frame;frame;... count` per line."""
    parts: Counter[str] = Counter()
    for line in folded:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            parts[part_of(stack)] += int(count)
    return parts


def table(parts: Counter[str], rate: int, hits: int) -> str:
    total = sum(parts.values())
    lines = ["| part | ms per hit | share |", "|---|---|---|"]
    for name, n in parts.most_common():
        lines.append(f"| {name} | {1000.0 * n / rate / hits:.2f} | {100.0 * n / total:.0f} % |")
    lines.append(f"| **all sampled** | **{1000.0 * total / rate / hits:.2f}** | 100 % |")
    return "\n".join(lines)


async def _hits(clients: Clients, target: Target, prompts: list[str], seconds: float) -> tuple[int, float]:
    """Semantic hits at concurrency 1 for `seconds`; (hits, mean client ms)."""
    n, spent, i = 0, 0.0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        status = await clients.call(target, "rest", prompts[i % len(prompts)])
        i += 1
        if status == "semantic":
            n += 1
            spent += time.perf_counter() - t
    return n, 1000.0 * spent / max(1, n)


async def _prepare(clients: Clients, target: Target, pairs_file: str | None, max_pairs: int) -> list[str]:
    from semserve.tooling import cache_eval

    pairs = [p for p in cache_eval.load_pairs(pairs_file or cache_eval.SPLITS["eval"]) if p.same_answer]
    pairs = pairs[:max_pairs]
    sem = asyncio.Semaphore(8)

    async def seed(prompt: str) -> None:
        async with sem:
            await clients.call(target, "rest", prompt, {"cache-control": "no-cache"})

    await asyncio.gather(*(seed(p.a) for p in pairs))
    stored = {p.a for p in pairs}
    return [p.b for p in pairs
            if p.b not in stored and await clients.call(target, "rest", p.b) == "semantic"]


async def _drive_while(clients: Clients, target: Target, prompts: list[str], seconds: float,
                       spy: list[str]) -> tuple[int, float]:  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*spy)
    hits = await _hits(clients, target, prompts, seconds)
    if await proc.wait() != 0:
        raise RuntimeError(f"py-spy failed: {' '.join(spy)}")
    return hits


def main(argv: list[str] | None = None) -> int:
    from semserve.tooling.local_redis import RedisServer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--predictor", required=True, metavar="HTTP_URL,GRPC_ADDR", help="a running predictor")
    p.add_argument("--seconds", type=float, default=20.0, help="per recording (SVG, then raw)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--name", default="before", help="bench/profile-semantic-hit-<name>.svg")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench")
    p.add_argument("--pairs", default=None, help="eval pairs JSONL (default: the eval split)")
    p.add_argument("--max-pairs", type=int, default=60, help="same-answer pairs to seed")
    p.add_argument("--results", default=None, help="append the table to this markdown file")
    args = p.parse_args(argv)
    # kserve parses sys.argv when it is imported (the gRPC client below): `--predictor` would be an
    # ambiguous prefix of its options there.
    sys.argv = sys.argv[:1]

    py_spy = str(Path(sys.executable).with_name("py-spy"))
    pred_grpc = args.predictor.split(",")[1]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    redis_dir = Path(tempfile.mkdtemp(prefix="redis-profile-", dir=LOG_DIR))
    redis = RedisServer(_free_port(), data_dir=redis_dir)
    t_http, t_grpc = _free_port(), _free_port()
    svg = args.out_dir / f"profile-semantic-hit-{args.name}.svg"
    raw = args.out_dir / f"profile-semantic-hit-{args.name}.txt"
    load_start = os.getloadavg()[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    redis.start()
    transformer = Proc(
        "transformer",
        ["transformer", "--http-port", str(t_http), "--grpc-port", str(t_grpc), "--predictor-host", pred_grpc,
         "--cache-redis-url", redis.url, "--cache-deployment", "bench_profile", "--embed-lru-size", "0",
         "--log-level", "warning"],
        f"http://127.0.0.1:{t_http}/v2/health/ready", LOG_DIR / "profile-transformer.log",
    )
    try:
        transformer.start()
        transformer.wait_ready(300)
        assert transformer.proc is not None
        pid = str(transformer.proc.pid)
        target = Target("transformer", f"http://127.0.0.1:{t_http}", f"127.0.0.1:{t_grpc}")

        async def run() -> tuple[int, float, int, float]:
            clients = Clients(8)
            try:
                prompts = await _prepare(clients, target, args.pairs, args.max_pairs)
                if not prompts:
                    raise RuntimeError("no paraphrase was answered as a semantic hit")
                print(f"==> {len(prompts)} paraphrases hit; warm-up, then py-spy {args.seconds:.0f} s "
                      f"SVG + {args.seconds:.0f} s raw", flush=True)
                await _hits(clients, target, prompts, 2.0)
                base = [py_spy, "record", "--pid", pid, "-r", str(args.rate), "-d", str(int(args.seconds)),
                        "--nonblocking"]
                n1, ms1 = await _drive_while(clients, target, prompts, args.seconds,
                                             [*base, "-o", str(svg), "-f", "flamegraph"])
                n2, ms2 = await _drive_while(clients, target, prompts, args.seconds,
                                             [*base, "-o", str(raw), "-f", "raw"])
                return n1, ms1, n2, ms2
            finally:
                await clients.close()

        n1, ms1, n2, ms2 = asyncio.run(run())
    finally:
        transformer.stop()
        redis.stop()
    parts = aggregate(raw.read_text().splitlines())
    text = table(parts, args.rate, n2)
    print(f"\nSVG: {svg} ({n1} hits, client mean {ms1:.2f} ms); raw: {raw} ({n2} hits, client mean "
          f"{ms2:.2f} ms)\n\n{text}")
    if args.results:
        with open(args.results, "a") as f:
            f.write(
                f"\n## Issue 26: profile of a semantic hit ({args.name}; {time.strftime('%Y-%m-%d')}, "
                f"{_machine()}, HEAD {commit})\n\n"
                f"Command: `python -m bench.profile_hit --predictor {args.predictor} --seconds "
                f"{args.seconds:.0f} --rate {args.rate} --name {args.name}`. v2 REST semantic hits at "
                f"concurrency 1 (`--embed-lru-size 0`), py-spy {args.rate} Hz on the transformer: "
                f"flame graph `bench/{svg.name}` ({n1} hits), folded stacks `bench/{raw.name}` ({n2} "
                f"hits, client mean {ms2:.2f} ms). Each sample goes to the innermost frame that matches "
                f"a part (bench/profile_hit.py PARTS); ms per hit = samples / rate / hits, summed over "
                f"threads. The machine was busy with other agents' work (1-min load average "
                f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end), and py-spy's own "
                f"sampling slows the process: read the shares, not the absolute figures.\n\n{text}\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
