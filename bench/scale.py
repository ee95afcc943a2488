"""`semserve bench scale`: what a lookup costs, and what an entry weighs, as the cache grows.

For each N in --entries, on a fresh local Redis with RediSearch (free port):

1. fill: N synthetic entries spread over T tenants, written with pipelines in the stored format of
   cache.store (hash fields of cache.schema, tenant sorted set, tenants hash, TTL), random unit
   vectors, no model calls. All share one model and fingerprint (the one a v2 request of the
   server part makes), so a tenant's scope tag (the KNN filter) selects its N/T entries.
2. index: FT.CREATE (cache.schema) after the writes, timed until FT.INFO says indexing is done:
   the build time of a restarted or rebuilt index. Redis used_memory before and after gives
   bytes per entry (data, and data + index).
3. in process: the store's exact lookup (HMGET) and KNN (FT.SEARCH through EntryStore), p50
   and p99, and recall@1 of the KNN against numpy brute force over the tenant's vectors, for each
   EF_RUNTIME in --ef-runtime (a query attribute: one build serves every value).
4. server (unless --skip-server): a `semserve transformer` on that Redis (no predictor: hits need
   none), exact and semantic hits over v2 REST at concurrency 1. Semantic hits: an entry stored
   under another key whose prompt and (real) embedding are the query's, so the server pays the
   full semantic path (exact miss, embedding, KNN, verifier) and the verifier's answer is certain.

    semserve bench scale --entries 1000,100000 --tenants 1000 --output bench/RESULTS.md --plot scale.png
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.predictor import ROOT, _free_port, _machine
from bench.procs import LOG_DIR, stop_process
from bench.scale_entries import (
    DEPLOYMENT,
    as_number,
    build_index,
    fill,
    index_info,
    request_fingerprint,
    unit_vectors,
)
from bench.scale_lookups import ScaleRow, measure_in_process, measure_server, seed_server_entries
from bench.scale_report import command_line, ef_table, plot, table

# `semserve transformer` with only the transformer's own CLI module loaded: the bench does not
# depend on every other subcommand importing cleanly.
_TRANSFORMER_MAIN = (
    "import argparse, sys\n"
    "from transformers_svc.cli import register\n"
    "parser = argparse.ArgumentParser(prog='semserve')\n"
    "register(parser.add_subparsers(dest='command', required=True))\n"
    "args = parser.parse_args()\n"
    "sys.argv = sys.argv[:1]\n"
    "sys.exit(int(args.func(args) or 0))\n"
)


def start_transformer(redis_url: str, extra: Sequence[str]) -> tuple[subprocess.Popen[bytes], str]:
    """A transformer on `redis_url` (no predictor behind it: hits need none); (process, base URL)."""
    import httpx

    http, grpc = _free_port(), _free_port()
    log = LOG_DIR / "scale-bench-transformer.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", _TRANSFORMER_MAIN, "transformer",
         "--http-port", str(http), "--grpc-port", str(grpc),
         "--predictor-host", f"127.0.0.1:{_free_port()}",
         "--cache-redis-url", redis_url, "--cache-deployment", DEPLOYMENT,
         "--embed-lru-size", "0", *extra],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"transformer exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_process(proc)
            raise TimeoutError(f"transformer not ready in 300 s; see {log}")
        time.sleep(0.5)


def _redis_server() -> type:
    from semserve.tooling.local_redis import RedisServer

    return RedisServer


def run_size(n: int, args: argparse.Namespace, rng: random.Random) -> ScaleRow:
    import redis

    from cache.schema import IndexSchema

    tenants = max(1, min(args.tenants, n))
    hnsw = {"hnsw_m": args.hnsw_m, "hnsw_ef_construction": args.ef_construction,
            "hnsw_ef_runtime": args.ef_runtime_default}
    schema = IndexSchema(DEPLOYMENT, vector_algorithm=args.algorithm,
                         **{k: v for k, v in hnsw.items() if v})  # unset: cache.schema's
    label = f"{schema.hnsw_m}/{schema.hnsw_ef_construction}/{schema.hnsw_ef_runtime}"
    row = ScaleRow(n, tenants, label if args.algorithm == "HNSW" else "FLAT")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="redis-scale-bench-", dir=LOG_DIR))
    server = _redis_server()(_free_port(), data_dir=data_dir)
    transformer = None
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        base_mem = int(client.info("memory")["used_memory"])
        vectors = unit_vectors(np.random.default_rng(rng.randrange(2**31)), n, schema.dim)
        print(f"==> N={n:,} over {tenants:,} tenants: writing", flush=True)
        t0 = time.monotonic()
        fill(client, schema, n, tenants, vectors)
        row.write_s = time.monotonic() - t0
        data_mem = int(client.info("memory")["used_memory"])
        print(f"  written in {row.write_s:.1f} s; building the index ({row.hnsw})", flush=True)
        row.index_s = build_index(client, schema, args.index_timeout)
        total_mem = int(client.info("memory")["used_memory"])
        row.data_bytes_per_entry = (data_mem - base_mem) / n
        row.total_bytes_per_entry = (total_mem - base_mem) / n
        row.vector_index_mb = as_number(index_info(client, schema.index_name).get("vector_index_sz_mb", 0))
        client.close()
        print(f"  index built in {row.index_s:.1f} s; {row.total_bytes_per_entry:,.0f} B/entry; "
              f"in-process lookups ({args.queries})", flush=True)
        ef_values = [0, *(int(x) for x in str(args.ef_runtime).split(",") if x and int(x) > 0)]
        asyncio.run(measure_in_process(server.url, schema, row, vectors, ef_values, args.queries, rng,
                                       args.noise))
        del vectors
        if not args.skip_server:
            print("  through the server (v2 REST, concurrency 1)", flush=True)
            exact, semantic = seed_server_entries(server.url, schema, request_fingerprint(schema))
            transformer, base = start_transformer(server.url, args.transformer_arg)
            measure_server(base, exact, semantic, args.server_requests, row)
    finally:
        if transformer is not None:
            stop_process(transformer)
        server.stop()
    return row


def main(args: argparse.Namespace) -> int:
    hnsw_only = [f for f, v in (("--hnsw-m", args.hnsw_m), ("--ef-construction", args.ef_construction),
                                 ("--ef-runtime", args.ef_runtime),
                                 ("--ef-runtime-default", args.ef_runtime_default)) if v]
    if hnsw_only and args.algorithm != "HNSW":
        print(f"semserve bench scale: {', '.join(hnsw_only)} need --algorithm HNSW", file=sys.stderr)
        return 2
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    rng = random.Random(args.seed)
    sizes = [int(float(x)) for x in str(args.entries).split(",") if x]
    rows = [run_size(n, args, rng) for n in sizes]
    minutes = (time.monotonic() - started) / 60
    main_table, efs = table(rows), ef_table(rows)
    print()
    print(main_table)
    if efs:
        print()
        print(efs)
    if args.plot:
        plot(rows, Path(args.plot))
        print(f"plot: {args.plot}")
    if args.output:
        with open(args.output, "a") as f:
            f.write(
                f"\n## Cache at scale ({time.strftime('%Y-%m-%d')}, {_machine()})\n\n"
                f"Command: `{command_line(args)}` ({minutes:.1f} min; 1-min load average "
                f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, shared machine). "
                f"Synthetic entries (random unit vectors, the stored format, one fingerprint), "
                f"index built after the writes (FT.CREATE until indexing is done). In process: "
                f"the store's HMGET and KNN (EntryStore), {args.queries} lookups each, "
                f"KNN of a noisy copy of a stored vector (noise {args.noise}), recall@1 against "
                f"brute force over the tenant's vectors. Server: a transformer on that Redis, "
                f"v2 REST, concurrency 1, {args.server_requests} exact and semantic hits each "
                f"(each semantic hit embeds its prompt: --embed-lru-size 0).\n\n{main_table}\n"
                + (f"\nEF_RUNTIME given on the query:\n\n{efs}\n" if efs else "")
                + (f"\nPlot: `{args.plot}`.\n" if args.plot else "")
            )
        print(f"appended to {args.output}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entries", default="1000,100000", help="comma-separated cache sizes (1e6 works)")
    p.add_argument("--tenants", type=int, default=1000, help="tenants the entries are spread over")
    p.add_argument("--queries", type=int, default=300, help="in-process lookups per kind and size")
    p.add_argument("--noise", type=float, default=0.5,
                   help="length of the random vector added to a stored vector to make a KNN query "
                        "(0.5: cosine about 0.89 to its source)")
    p.add_argument("--hnsw-m", type=int, default=0, help="HNSW M (0: cache.schema's)")
    p.add_argument("--ef-construction", type=int, default=0, help="HNSW EF_CONSTRUCTION (0: cache.schema's)")
    p.add_argument("--algorithm", choices=("HNSW", "FLAT"), default="FLAT",
                   help="vector index: FLAT (brute force, cache.schema's default) or HNSW (its parameters)")
    p.add_argument("--ef-runtime", default="", help="EF_RUNTIME values to try on the query, e.g. 10,50")
    p.add_argument("--ef-runtime-default", type=int, default=0, help="the index's EF_RUNTIME (0: schema)")
    p.add_argument("--index-timeout", type=float, default=7200.0, help="seconds to wait for the index")
    p.add_argument("--server-requests", type=int, default=200, help="server hits per kind and size")
    p.add_argument("--skip-server", action="store_true", help="no transformer part")
    p.add_argument("--transformer-arg", action="append", default=[], help="extra transformer flag")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="append the markdown section to this file")
    p.add_argument("--plot", default=None, help="write a PNG of p50 latency against size")
