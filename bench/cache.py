"""`semserve bench cache`: client-measured latency through the transformer, and RedisVL side by side.

One run starts a Redis with RediSearch (free port), the predictor and the transformer in front of
it (free ports, subprocesses like `semserve bench predictor`), then measures, from a client in this
process, each path x protocol (v2 REST via httpx, v2 gRPC via grpc.aio) x concurrency:

  exact     a prompt stored before, sent again (exact layer: one Redis GET, no embedding)
  semantic  a paraphrase of a stored prompt that the verifier accepts (eval pairs with
            same_answer true that the offline evaluator serves); the transformer runs with
            --embed-lru-size 0 so every semantic hit pays its embedding, as a new paraphrase does
  miss      fresh prompts through the transformer (embed, KNN, verifier, predictor, store)
  direct    prompts of the same shape straight to the predictor; miss overhead = miss p50 - direct p50
  floor     the model-ready probe (REST GET / gRPC ModelReady): the client + server stack alone

Then the hit paths against their floors (bench/cache_floors.py, `--floor-requests`; issue 26): the
semantic hit at c=1 alternated with the bare forward of the same embedder in a process of its own,
32 concurrent semantic hits against c=1, and the exact hit alternated with a bare ASGI app on
uvicorn / a bare grpc.aio server answering the same client with a body of the same size.
`--predictor HTTP_URL,GRPC_ADDR` uses a running predictor instead of starting one.

Miss and direct requests are interleaved in chunks (one request at concurrency 1, one wave of
`concurrency` requests above), so noise from other work on the machine hits both alike.

Side by side, in this process and on the same Redis (own index names): RedisVL's SemanticCache with
our embedder as its vectorizer (bench/redisvl_peer.py). Lookup latency of our SemanticCache.lookup
vs RedisVL's check (calls interleaved), and the labelled eval pairs through both caches.

    .venv/bin/semserve bench cache --output bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cache_clients import Clients, Target
from bench.cache_e2e import Cell, end_to_end
from bench.cache_floors import FloorRow, floors, floors_table
from bench.cache_peer import PeerLatency, our_cache, peer_latency
from bench.cache_report import e2e_table, eval_table, overhead_table, peer_latency_table
from bench.predictor import _free_port, _machine
from bench.procs import LOG_DIR, Proc


def main(args: argparse.Namespace) -> int:
    from cache.embedder import Embedder, EmbedderSettings
    from cache.keys import normalize_text
    from cache.verify import RuleVerifier
    from semserve import model_prep
    from semserve.tooling import cache_eval
    from semserve.tooling.local_redis import RedisServer

    started = time.monotonic()
    load_start = os.getloadavg()[0]
    rng = random.Random(args.seed)
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    max_seqs = max(32, *levels)
    pairs = cache_eval.load_pairs(args.pairs or cache_eval.SPLITS["eval"])
    model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    redis_dir = Path(tempfile.mkdtemp(prefix="redis-cache-bench-", dir=LOG_DIR))
    redis = RedisServer(_free_port(), data_dir=redis_dir)
    p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
    # A running predictor (`--predictor HTTP_URL,GRPC_ADDR`) instead of one of our own.
    shared = args.predictor.split(",") if args.predictor else None
    pred_http = shared[0].rstrip("/") if shared else f"http://127.0.0.1:{p_http}"
    pred_grpc = shared[1] if shared else f"127.0.0.1:{p_grpc}"
    predictor = Proc(
        "predictor",
        ["predictor", "--model", str(model_dir), "--http-port", str(p_http), "--grpc-port", str(p_grpc),
         "--max-num-seqs", str(max_seqs), "--max-model-len", "2048", "--log-level", "warning"],
        f"http://127.0.0.1:{p_http}/v2/health/ready", LOG_DIR / "cache-bench-predictor.log",
    )
    transformer = Proc(
        "transformer",
        ["transformer", "--http-port", str(t_http), "--grpc-port", str(t_grpc),
         "--predictor-host", pred_grpc,
         "--cache-redis-url", "REDIS", "--cache-deployment", "bench_e2e",
         "--embed-lru-size", "0", *args.transformer_arg],
        f"http://127.0.0.1:{t_http}/v2/health/ready", LOG_DIR / "cache-bench-transformer.log",
    )
    t2_http, t2_grpc = _free_port(), _free_port()
    route_off = Proc(
        "transformer-kserve-route",
        ["transformer", "--http-port", str(t2_http), "--grpc-port", str(t2_grpc),
         "--predictor-host", f"127.0.0.1:{p_grpc}",
         "--cache-redis-url", "REDIS", "--cache-deployment", "bench_e2e",
         "--embed-lru-size", "0", *args.transformer_arg, "--no-v2-fast-path"],
        f"http://127.0.0.1:{t2_http}/v2/health/ready", LOG_DIR / "cache-bench-transformer-off.log",
    )
    route_report = ""
    peer_version = "-"
    eval_reports: list[tuple[str, Any]] = []
    peer_results: list[PeerLatency] = []
    cells: list[Cell] = []
    floor_rows: list[FloorRow] = []
    try:
        print(f"==> Redis with RediSearch (data in {redis_dir})", flush=True)
        redis.start()
        transformer.args[transformer.args.index("REDIS")] = redis.url
        route_off.args[route_off.args.index("REDIS")] = redis.url
        print(f"==> predictor (model {model_dir}, max_num_seqs {max_seqs}); starting in the background",
              flush=True)
        if not shared:
            predictor.start()

        # While the engine loads: embeddings, pair selection and the accuracy figures (counts, so
        # the CPU the engine takes does not change them).
        print("==> embedder and eval pairs", flush=True)
        embedder = Embedder(EmbedderSettings(lru_size=0))
        verifier = RuleVerifier()
        texts = list(dict.fromkeys([p.a for p in pairs] + [p.b for p in pairs]))
        vectors = dict(zip(texts, embedder.embed_many(texts), strict=True))
        sims = np.array([float(vectors[p.a] @ vectors[p.b]) for p in pairs])
        offline = cache_eval.evaluate_offline(pairs, verifier=verifier, similarities=sims)
        a_norm = {normalize_text(p.a) for p in pairs}
        chosen = [o.pair for o in offline.outcomes
                  if o.served and o.pair.same_answer and normalize_text(o.pair.b) not in a_norm]
        if args.max_pairs:
            chosen = chosen[: args.max_pairs]
        exact_prompts = list(dict.fromkeys(p.a for p in chosen))
        semantic_prompts = list(dict.fromkeys(p.b for p in chosen))
        print(f"  {len(pairs)} pairs; {len(chosen)} served same-answer pairs for the hit paths "
              f"({len(exact_prompts)} stored prompts, {len(semantic_prompts)} paraphrases)", flush=True)

        print("==> eval pairs through our SemanticCache (Redis)", flush=True)

        async def make_cache() -> Any:
            c = our_cache(redis.url, "bench_eval", embedder, verifier)
            await c.start()
            return c

        ours_eval = asyncio.run(cache_eval.evaluate_through_cache(pairs, make_cache))
        eval_reports += [("ours: SemanticCache.lookup (exact, KNN, verifier) on Redis", ours_eval),
                         ("ours: offline (same embeddings + verifier, no Redis)", offline),
                         ("plain cosine >= 0.90, offline (what distance 0.1 means)",
                          cache_eval.evaluate_threshold(pairs, sims, 0.90))]
        if not args.skip_redisvl:
            from bench import redisvl_peer

            peer_version = redisvl_peer.version()
            print(f"==> eval pairs through RedisVL {peer_version} SemanticCache (distance_threshold "
                  f"{redisvl_peer.DEFAULT_DISTANCE_THRESHOLD})", flush=True)
            eval_reports.append((f"RedisVL {peer_version} SemanticCache, distance_threshold 0.1 (default)",
                                 redisvl_peer.evaluate(pairs, vectors, redis.url, embedder)))
        print(eval_table(eval_reports), flush=True)

        print("==> waiting for the predictor", flush=True)
        if not shared:
            predictor.wait_ready()
        print("==> transformer", flush=True)
        transformer.start()
        transformer.wait_ready(300)
        print(f"==> end to end: {args.requests_hit} requests per hit cell, {args.requests_miss} per "
              f"miss/direct cell, max_tokens {args.max_tokens}", flush=True)
        cells = asyncio.run(end_to_end(
            Target("transformer", f"http://127.0.0.1:{t_http}", f"127.0.0.1:{t_grpc}"),
            Target("predictor", pred_http, pred_grpc),
            exact_prompts, semantic_prompts, levels, args.requests_hit, args.requests_miss,
            args.max_tokens, args.warmup, rng,
        ))
        if args.v2_route_ab:
            route_report = _route_ab(args, route_off, exact_prompts,
                                     Target("owned route", f"http://127.0.0.1:{t_http}", ""),
                                     Target("KServe's route", f"http://127.0.0.1:{t2_http}", ""))
        if args.floor_requests:
            floor_rows = asyncio.run(_floors(args, Target("transformer", f"http://127.0.0.1:{t_http}",
                                                              f"127.0.0.1:{t_grpc}"),
                                             exact_prompts, semantic_prompts, rng))
        # The in-process comparison runs with the servers gone: less noise for both caches.
        transformer.stop()
        predictor.stop()
        if not args.skip_redisvl:
            print(f"==> lookup latency in process: ours vs RedisVL ({args.peer_iters} rounds)", flush=True)
            stored = list(dict.fromkeys(p.a for p in pairs))
            peer_results = asyncio.run(peer_latency(
                redis.url, embedder, verifier, stored, vectors, exact_prompts, semantic_prompts,
                args.peer_iters, rng,
            ))
    finally:
        transformer.stop()
        route_off.stop()
        predictor.stop()
        redis.stop()

    e2e, missed = e2e_table(cells)
    over, missed_over = overhead_table(cells)
    missed += missed_over
    peer = peer_latency_table(peer_results, peer_version) if peer_results else "(RedisVL skipped)"
    evals = eval_table(eval_reports)
    minutes = (time.monotonic() - started) / 60
    print()
    print(e2e)
    print()
    print(over)
    print()
    print(peer)
    print()
    print(evals)
    if route_report:
        print()
        print(route_report)
    if floor_rows:
        print()
        print(floors_table(floor_rows))
    print(f"\n{'goals not met: ' + '; '.join(missed) if missed else 'all latency goals met'}")
    print(f"engine start {predictor.start_s:.0f} s, transformer start {transformer.start_s:.0f} s, "
          f"whole bench {minutes:.1f} min")
    if args.output:
        cmd = (f"semserve bench cache --concurrency {args.concurrency} --requests-hit {args.requests_hit} "
               f"--requests-miss {args.requests_miss} --max-tokens {args.max_tokens}")
        notes = "\n".join(f"- not met: {m}" for m in missed) or "- all latency goals met"
        with open(args.output, "a") as f:
            f.write(
                f"\n## Semantic cache end to end, and RedisVL side by side ({time.strftime('%Y-%m-%d')}, "
                f"{_machine()})\n\n"
                f"Command: `{cmd}` ({minutes:.1f} min). Client in the bench process (httpx for v2 REST, "
                f"grpc.aio for v2 gRPC), closed loop, latency per request as the client sees it. "
                f"Transformer with default settings except `--embed-lru-size 0` (each semantic hit "
                f"embeds its prompt); predictor `--max-num-seqs {max_seqs}`, temperature 0, max_tokens "
                f"{args.max_tokens}. Hit paths: {len(chosen)} same-answer eval pairs that the offline "
                f"evaluator serves ({len(exact_prompts)} stored prompts, {len(semantic_prompts)} "
                f"paraphrases). Miss and direct cells interleaved. `floor` is the model-ready probe "
                f"(GET /v2/models/llm/ready, gRPC ModelReady): same client and server stack, no cache "
                f"work. At concurrency 16 a closed loop on 2 cores measures queueing: p50 is about "
                f"16 / req/s. Server/lookup means come from the transformer's /metrics. Engine start "
                f"{predictor.start_s:.0f} s. The machine is shared with other engineers' test runs "
                f"(1-min load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at "
                f"the end): figures carry their noise.\n\n"
                f"{e2e}\n\nMiss overhead (miss p50 - direct p50, same prompt shape, interleaved):\n\n"
                f"{over}\n\nLookup latency in process, same Redis, same embedder (RedisVL's vectorizer is "
                f"our ONNX MiniLM), {len(list(dict.fromkeys(p.a for p in pairs)))} stored prompts each, "
                f"calls interleaved; RedisVL has no exact layer, so a repeat costs it an embedding:\n\n"
                f"{peer}\n\nEval pairs ({len(pairs)}, cache/data/eval_pairs.jsonl), same embeddings:\n\n"
                f"{evals}\n\n{notes}\n"
            )
            if floor_rows:
                f.write(f"\nThe hit paths against their floors, same run (bench/cache_floors.py; "
                        f"{args.floor_requests} requests each, alternated in rounds of 10 with the "
                        f"peer):\n\n{floors_table(floor_rows)}\n")
        print(f"appended to {args.output}")
    bad = any(c.errors for c in cells)
    return 1 if bad else 0


async def _floors(args: argparse.Namespace, transformer: Target, exact_prompts: list[str],
                  semantic_prompts: list[str], rng: random.Random) -> list[FloorRow]:  # fmt: skip
    clients = Clients(args.max_tokens)
    try:
        return await floors(clients, transformer, exact_prompts, semantic_prompts, args.floor_requests, rng)
    finally:
        await clients.close()


def _route_ab(args: argparse.Namespace, route_off: Proc, prompts: list[str], on: Target,
              off: Target) -> str:  # fmt: skip
    """The v2 REST route side by side (bench/cache_route_ab.py); the second transformer is
    stopped again before the rest of the bench."""
    from bench.cache_route_ab import route_ab, route_ab_table

    print(f"==> v2 REST route side by side: {args.v2_route_ab} exact hits each", flush=True)
    route_off.start()
    try:
        route_off.wait_ready(300)
        table = route_ab_table(*asyncio.run(route_ab(on, off, prompts, args.v2_route_ab)))
    finally:
        route_off.stop()
    print(table, flush=True)
    return table
