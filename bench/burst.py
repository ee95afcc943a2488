"""A burst of B identical prompts over N transformer replicas: predictor generations and latency,
with and without the cross-replica lease (cache/lease.py).

Starts the predictor and a Redis once; for each configuration, N replicas on one fresh cache
deployment (behind nginx, round robin, when N > 1) and R bursts, each of a prompt nobody asked
before: B concurrent identical OpenAI chat requests (temperature 0). Generations are counted at
the predictor (its /metrics); latency is each request's own, from the burst's start.

    .venv/bin/python -m bench.burst --burst 30 --replicas 1 3 --rounds 3 --output bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.predictor import ROOT, _free_port, _percentile

LOG_DIR = ROOT / ".cache" / "bench-logs"
GENERATIONS = "semserve_predictor_generations_total"
MAX_TOKENS = 32


@dataclass(frozen=True)
class Config:
    replicas: int
    lease: bool

    @property
    def label(self) -> str:
        return f"N={self.replicas}, lease {'on' if self.lease else 'off'}"


@dataclass
class Result:
    config: Config
    generations: list[float]  # per burst
    latencies_s: list[float]  # every request of every burst
    errors: int

    def row(self, burst: int) -> str:
        lat = sorted(self.latencies_s)
        gens = ", ".join(f"{g:g}" for g in self.generations)
        return (f"| {burst} | {self.config.replicas} | {'on' if self.config.lease else 'off'} | "
                f"{statistics.mean(self.generations):.1f} ({gens}) | "
                f"{_percentile(lat, 0.50) * 1000:.0f} | {_percentile(lat, 0.99) * 1000:.0f} | "
                f"{self.errors} |")


def _generations(predictor_http: str) -> float:
    from tests.support import metric_value

    return metric_value(httpx.get(f"{predictor_http}/metrics", timeout=10).text, GENERATIONS)


async def _burst(base: str, n: int) -> tuple[list[float], int]:
    body = {"model": "llm", "temperature": 0, "max_tokens": MAX_TOKENS, "messages": [
        {"role": "user", "content": f"Tell me one fact about rivers (burst {uuid.uuid4().hex[:8]})."}]}

    async def one(client: httpx.AsyncClient, t0: float) -> float | None:
        r = await client.post(f"{base}/openai/v1/chat/completions", json=body)
        return time.monotonic() - t0 if r.status_code == 200 else None

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=n)) as client:
        t0 = time.monotonic()
        got = await asyncio.gather(*[one(client, t0) for _ in range(n)])
    ok = [g for g in got if g is not None]
    return ok, n - len(ok)


def run_config(cfg: Config, burst: int, rounds: int, predictor_http: str, predictor_grpc: str,
               redis_url: str, work: Path) -> Result:
    from bench.procs import Proc
    from semserve.loadbalancer import Backend, Frontend, LoadBalancer

    deployment = f"burst{uuid.uuid4().hex[:6]}"
    ports = [(_free_port(), _free_port()) for _ in range(cfg.replicas)]
    tag = f"n{cfg.replicas}-lease-{'on' if cfg.lease else 'off'}"
    lease_flag = "--cache-singleflight-replicas" if cfg.lease else "--no-cache-singleflight-replicas"
    procs = [
        Proc(f"replica-{i}", ["transformer", "--http-port", str(h), "--grpc-port", str(g),
                              "--predictor-host", predictor_grpc, "--cache-redis-url", redis_url,
                              "--cache-deployment", deployment, "--log-level", "warning",
                              lease_flag],
             f"http://127.0.0.1:{h}/v2/health/ready", LOG_DIR / f"burst-{tag}-replica-{i}.log")
        for i, (h, g) in enumerate(ports)
    ]  # fmt: skip
    lb: LoadBalancer | None = None
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready(300)
        base = f"http://127.0.0.1:{ports[0][0]}"
        if cfg.replicas > 1:
            lb = LoadBalancer(Frontend(_free_port(), _free_port(), work / f"nginx-{deployment}"),
                              [Backend(h, g) for h, g in ports]).start()
            base = lb.http_url
            time.sleep(1.0)
        asyncio.run(_burst(base, 2))  # warm-up: connections, first embedding
        gens, lats, errors = [], [], 0
        for _ in range(rounds):
            before = _generations(predictor_http)
            ok, failed = asyncio.run(_burst(base, burst))
            time.sleep(0.5)  # the metric is bumped as the generation finishes
            gens.append(_generations(predictor_http) - before)
            lats.extend(ok)
            errors += failed
        return Result(cfg, gens, lats, errors)
    finally:
        if lb is not None:
            lb.stop()
        for p in reversed(procs):
            p.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=30)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=None, help="append the table to this file")
    args = parser.parse_args()

    from bench.procs import Proc
    from semserve import model_prep
    from semserve.tooling.local_redis import RedisServer

    LOG_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="burst-", dir=LOG_DIR))
    redis = RedisServer(_free_port(), data_dir=work / "redis").start()
    p_http, p_grpc = _free_port(), _free_port()
    pred = Proc("predictor", ["predictor", "--model", str(model_prep.prepare().model_dir),
                              "--http-port", str(p_http), "--grpc-port", str(p_grpc),
                              "--max-model-len", "2048"],
                f"http://127.0.0.1:{p_http}/v2/health/ready", LOG_DIR / "burst-predictor.log")  # fmt: skip
    results = []
    try:
        pred.start()
        pred.wait_ready()
        for n in args.replicas:
            for lease in (True, False):
                res = run_config(Config(n, lease), args.burst, args.rounds, f"http://127.0.0.1:{p_http}",
                                 f"127.0.0.1:{p_grpc}", redis.url, work)
                print(res.row(args.burst), flush=True)
                results.append(res)
    finally:
        pred.stop()
        redis.stop()
    table = "\n".join([
        "| burst B | replicas N | cross-replica lease | predictor generations per burst (each) | "
        "p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
        *[r.row(args.burst) for r in results],
    ])
    print(table)
    if args.output:
        cmd = (f".venv/bin/python -m bench.burst --burst {args.burst} --replicas "
               f"{' '.join(map(str, args.replicas))} --rounds {args.rounds}")
        with open(args.output, "a") as f:
            f.write(f"\n```\n{cmd}\n```\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
