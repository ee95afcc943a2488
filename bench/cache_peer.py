"""`semserve bench cache`, in process: our SemanticCache's lookup latency vs RedisVL's check,
on the same Redis with the same embedder, calls interleaved."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.cache_clients import MODEL


@dataclass
class PeerLatency:
    kind: str
    ours_ms: list[float] = field(default_factory=list)
    theirs_ms: list[float] = field(default_factory=list)
    ours_hits: int = 0
    theirs_hits: int = 0
    ours_parts: dict[str, list[float]] = field(default_factory=dict)  # ms per lookup phase


def our_cache(redis_url: str, deployment: str, embedder: Any, verifier: Any) -> Any:
    from cache.entry_store import EntryStore
    from cache.semantic_cache import SemanticCache
    from cache.settings import CacheSettings

    settings = CacheSettings(
        redis_url=redis_url, deployment=deployment,
        # Generous budgets: a shared, loaded machine must not turn slow lookups into errors here.
        lookup_timeout_ms=5000.0, store_timeout_ms=5000.0, embed_timeout_ms=5000.0,
    )
    return SemanticCache(EntryStore.from_settings(settings), embedder, verifier, settings)


async def peer_latency(
    redis_url: str, embedder: Any, verifier: Any, stored: Sequence[str], vectors: dict[str, np.ndarray],
    exact_prompts: Sequence[str], semantic_prompts: Sequence[str], iters: int, rng: random.Random,
) -> list[PeerLatency]:
    from bench.redisvl_peer import Peer
    from cache.keys import CacheRequest, SamplingKey

    sampling = SamplingKey(max_tokens=8, temperature=0.0)

    def req(prompt: str) -> CacheRequest:
        return CacheRequest(tenant="bench-peer", model=MODEL, kind="completion", prompt=prompt,
                            sampling=sampling)

    ours = our_cache(redis_url, "bench_peer", embedder, verifier)
    await ours.start()
    theirs = Peer(redis_url, embedder, "bench_redisvl")
    try:
        print(f"  storing {len(stored)} prompts in both caches", flush=True)
        for p in stored:
            await ours.store(req(p), {"text": f"answer to: {p}", "finish_reason": "stop",
                                      "completion_tokens": 1}, vectors[p])
            theirs.store(p, f"answer to: {p}", vectors[p])
        results = [PeerLatency("repeat of a stored prompt"), PeerLatency("paraphrase of a stored prompt"),
                   PeerLatency("paraphrase, vector given (no embedding)")]
        plan = [(results[0], exact_prompts), (results[1], semantic_prompts), (results[2], semantic_prompts)]
        for _r, prompts in plan:  # warm-up
            for p in prompts[:10]:
                await ours.lookup(req(p))
                theirs.check(prompt=p)
        for i in range(iters):
            for r, prompts in plan:
                p = prompts[rng.randrange(len(prompts))]
                calls = ["ours", "theirs"] if i % 2 == 0 else ["theirs", "ours"]
                for who in calls:
                    if who == "ours":
                        t = time.perf_counter()
                        res = await ours.lookup(req(p))
                        ms = (time.perf_counter() - t) * 1000.0
                        if r is results[2]:  # ours computes its own vector: take the embedding out
                            ms -= res.timings.get("embed", 0.0)
                        r.ours_ms.append(ms)
                        r.ours_hits += res.hit
                        for part, v in res.timings.items():
                            r.ours_parts.setdefault(part, []).append(v)
                    elif r is results[2]:
                        ms, hit = theirs.timed_check_vector(vectors[p])
                        r.theirs_ms.append(ms)
                        r.theirs_hits += hit
                    else:
                        ms, hit = theirs.timed_check(p)
                        r.theirs_ms.append(ms)
                        r.theirs_hits += hit
            if (i + 1) % 100 == 0:
                print(f"    {i + 1}/{iters} rounds", flush=True)
        return results
    finally:
        theirs.delete()
        await ours.close()
