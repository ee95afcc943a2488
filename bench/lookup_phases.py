"""Where a lookup's time goes, in process: SemanticCache.lookup on a real local Redis with the bundled
embedder and the real verifier, per phase p50/p99, variants alternated in one run.

    .venv/bin/python -m bench.lookup_phases [--rounds 300] \\
        [--variant base] [--variant t1:embed.threads=1] [--variant overlap:cache.overlap_embed=true]

Stored prompts are the `a` side of cache/data/eval_pairs.jsonl pairs that the offline evaluator
serves (same-answer, one tenant, ~180 entries); an exact lookup asks one of them again, a semantic
lookup one of their paraphrases (`b`). Every variant has its own Embedder (LRU off, so each semantic
lookup embeds) and SemanticCache over the same entries; each round runs one exact and one semantic
lookup per variant, in a rotating order, so load from other work on the machine hits all alike.

The embedding is split further by wrapping the embedder's own steps: `queue` (embed() called ->
forward starts), `encode` (tokenizer), `run` (the ONNX/torch forward), `pool` (mean pooling and
normalisation), `handoff` (forward done -> the awaiting lookup resumes). `cpu` is the process CPU
time (all threads) of one lookup. A `bare` row times `embed_many([text])` with no event loop.
`--concurrency N` starts N lookups of a kind together per slot (the batcher's case; no embed split).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PHASES = ("exact", "embed", "search", "verify", "total", "wall", "cpu")
EMBED_PARTS = ("queue", "encode", "run", "pool", "handoff")


@dataclass
class Samples:
    """Milliseconds per named part, one list per part."""

    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, part: str, ms: float) -> None:
        self.parts.setdefault(part, []).append(ms)


@dataclass
class Variant:
    name: str
    embed: dict[str, Any]  # EmbedderSettings overrides
    cache: dict[str, Any]  # CacheSettings overrides
    semantic: Samples = field(default_factory=Samples)
    exact: Samples = field(default_factory=Samples)
    hits: int = 0
    lookups: int = 0


def parse_variant(spec: str) -> Variant:
    """`name:embed.threads=1,cache.knn_k=3` (values parsed like the settings' env values)."""
    from cache.settings import CacheSettings, EmbedderSettings

    name, _, rest = spec.partition(":")
    out = Variant(name, {}, {})
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        scope, _, fname = key.partition(".")
        cls, target = {"embed": (EmbedderSettings, out.embed), "cache": (CacheSettings, out.cache)}[scope]
        kind = {f.name: f.type for f in dataclasses.fields(cls)}[fname]
        target[fname] = _parse_value(str(kind), value)
    return out


def _parse_value(kind: str, value: str) -> Any:
    if kind.startswith("bool"):
        return value.lower() in ("1", "true", "yes", "on")
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    return value


class EmbedProbe:
    """Timestamps of the embedder's steps for one lookup at a time (concurrency 1), taken by
    wrapping the instance's methods: the embedder itself carries no timing code."""

    def __init__(self, embedder: Any) -> None:
        self.marks: dict[str, float] = {}
        self.parts: dict[str, float] = {}
        wrap_async = embedder.embed
        wrap_forward = embedder._forward
        wrap_encode = embedder._encode
        wrap_run = embedder._run

        async def embed(text: str) -> np.ndarray:
            self.marks = {"call": time.perf_counter()}
            vec = await wrap_async(text)
            self.marks["resume"] = time.perf_counter()
            return vec

        def forward(texts: Sequence[str]) -> np.ndarray:
            self.marks["start"] = time.perf_counter()
            out = wrap_forward(texts)
            self.marks["end"] = time.perf_counter()
            return out

        def encode(texts: Sequence[str]) -> Any:
            t = time.perf_counter()
            out = wrap_encode(texts)
            self.marks["encode"] = time.perf_counter() - t
            return out

        def run(enc: Any) -> np.ndarray:
            t = time.perf_counter()
            out = wrap_run(enc)
            self.marks["run"] = time.perf_counter() - t
            return out

        embedder.embed, embedder._forward, embedder._encode, embedder._run = embed, forward, encode, run

    def take(self) -> dict[str, float]:
        m, self.marks = self.marks, {}
        if not {"call", "start", "end", "resume"} <= set(m):
            return {}
        forward = m["end"] - m["start"]
        return {k: v * 1000.0 for k, v in {
            "queue": m["start"] - m["call"],
            "encode": m["encode"],
            "run": m["run"],
            "pool": forward - m["encode"] - m["run"],
            "handoff": m["resume"] - m["end"],
        }.items()}


def served_pairs() -> tuple[list[str], list[str], dict[str, np.ndarray], Any]:
    """(stored prompts, paraphrases, vectors, embedder) for the eval pairs the offline path serves."""
    from cache.embedder import Embedder
    from cache.keys import normalize_text
    from cache.settings import EmbedderSettings
    from cache.verify import RuleVerifier
    from semserve.tooling import cache_eval

    pairs = cache_eval.load_pairs(cache_eval.SPLITS["eval"])
    embedder = Embedder(EmbedderSettings(lru_size=0))
    texts = list(dict.fromkeys([p.a for p in pairs] + [p.b for p in pairs]))
    vectors = dict(zip(texts, embedder.embed_many(texts), strict=True))
    sims = np.array([float(vectors[p.a] @ vectors[p.b]) for p in pairs])
    offline = cache_eval.evaluate_offline(pairs, verifier=RuleVerifier(), similarities=sims)
    a_norm = {normalize_text(p.a) for p in pairs}
    chosen = [o.pair for o in offline.outcomes
              if o.served and o.pair.same_answer and normalize_text(o.pair.b) not in a_norm]
    stored = list(dict.fromkeys(p.a for p in chosen))
    return stored, list(dict.fromkeys(p.b for p in chosen)), vectors, embedder


async def measure(
    redis_url: str, variants: list[Variant], rounds: int, warmup: int, seed: int, kinds: Sequence[str],
    concurrency: int = 1,
) -> Samples:
    from cache.embedder import Embedder
    from cache.entry_store import EntryStore
    from cache.keys import CacheRequest, SamplingKey
    from cache.semantic_cache import SemanticCache
    from cache.settings import CacheSettings, EmbedderSettings
    from cache.verify import RuleVerifier

    stored, paraphrases, vectors, ref_embedder = served_pairs()
    print(f"  {len(stored)} stored prompts, {len(paraphrases)} paraphrases", flush=True)
    sampling = SamplingKey(max_tokens=8, temperature=0.0)

    def req(prompt: str) -> CacheRequest:
        return CacheRequest(tenant="bench-phases", model="llm", kind="completion", prompt=prompt,
                            sampling=sampling)

    def settings(v: Variant) -> CacheSettings:
        # Generous budgets: a shared, loaded machine must not turn slow lookups into errors here.
        return CacheSettings(redis_url=redis_url, deployment="bench_phases", lookup_timeout_ms=5000.0,
                             store_timeout_ms=5000.0, embed_timeout_ms=5000.0, **v.cache)

    caches: list[tuple[Variant, SemanticCache, EmbedProbe | None]] = []
    for v in variants:
        emb = Embedder(EmbedderSettings(**{"lru_size": 0, **v.embed}))
        c = SemanticCache(EntryStore.from_settings(settings(v)), emb, RuleVerifier(), settings(v))
        await c.start()
        caches.append((v, c, EmbedProbe(emb) if concurrency == 1 else None))
    first = caches[0][1]
    for p in stored:
        await first.store(req(p), {"text": f"answer to: {p}", "finish_reason": "stop",
                                   "completion_tokens": 1}, vectors[p])
    rng = random.Random(seed)
    bare = Samples()
    try:
        for i in range(warmup + rounds):
            order = caches[i % len(caches):] + caches[: i % len(caches)]
            for v, c, probe in order:
                for kind, prompts in (("exact", stored), ("semantic", paraphrases)):
                    if kind not in kinds:
                        continue
                    batch = [prompts[rng.randrange(len(prompts))] for _ in range(concurrency)]
                    cpu, t = time.process_time(), time.perf_counter()
                    results = await asyncio.gather(*(c.lookup(req(p)) for p in batch))
                    wall, cpu = (time.perf_counter() - t) * 1000.0, (time.process_time() - cpu) * 1000.0
                    parts = probe.take() if probe is not None else {}
                    if i < warmup:
                        continue
                    samples = v.semantic if kind == "semantic" else v.exact
                    samples.add("wall", wall)
                    samples.add("cpu", cpu / concurrency)
                    for part, ms in parts.items():  # at concurrency 1 only: the probe follows one call
                        samples.add(part, ms)
                    for res in results:
                        v.lookups += 1
                        v.hits += res.hit
                        for part, ms in res.timings.items():
                            samples.add(part, ms)
            if i >= warmup:
                p = paraphrases[rng.randrange(len(paraphrases))]
                t = time.perf_counter()
                ref_embedder.embed_many([p])
                bare.add("embed", (time.perf_counter() - t) * 1000.0)
            if (i + 1) % 100 == 0:
                print(f"    {i + 1}/{warmup + rounds} rounds", flush=True)
    finally:
        for _, c, _ in caches:
            await c.embedder.aclose()  # type: ignore[attr-defined]
            await c.close()
    return bare


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _cell(samples: Samples, part: str) -> str:
    xs = samples.parts.get(part)
    return f"{statistics.median(xs):.2f} / {pct(xs, 0.99):.2f}" if xs else "-"


def report(variants: list[Variant], bare: Samples, rounds: int, load: tuple[float, float]) -> str:
    cols = (*PHASES, *EMBED_PARTS)
    lines = [
        f"SemanticCache.lookup in process, {rounds} rounds, p50 / p99 ms (n = rounds x concurrency per "
        f"lookup phase; wall: one slot of `concurrency` lookups, cpu: per lookup); "
        f"1-min load {load[0]:.1f} at the start, {load[1]:.1f} at the end",
        "",
        "| variant | lookup | n | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for v in variants:
        for kind, samples in (("exact", v.exact), ("semantic", v.semantic)):
            n = len(samples.parts.get("total", []))
            if not n:
                continue
            lines.append(f"| {v.name} | {kind} | {n} | " + " | ".join(_cell(samples, c) for c in cols) + " |")
    rest = " - |" * (len(cols) - 2)
    lines.append(f"| bare embed_many([text]) | - | - | - | {_cell(bare, 'embed')} |{rest}")
    lines += ["", "hits / lookups: " + ", ".join(f"{v.name} {v.hits}/{v.lookups}" for v in variants)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import os

    from semserve.tooling.local_redis import RedisServer, free_port

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--variant", action="append", default=[],
                    help="name:embed.FIELD=V,cache.FIELD=V (repeatable; default one 'base' variant)")
    ap.add_argument("--redis-url", default="", help="an existing Redis with RediSearch (default: start one)")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="lookups started together per slot (above 1: no embed split; cpu is per lookup)")
    ap.add_argument("--lookups", default="exact,semantic",
                    help="which lookups each round runs: exact (a stored prompt), semantic (a paraphrase)")
    args = ap.parse_args(argv)
    variants = [parse_variant(s) for s in args.variant or ["base"]]
    load_start = os.getloadavg()[0]
    server: RedisServer | None = None
    url = args.redis_url
    if not url:
        server = RedisServer(free_port(), data_dir=tempfile.mkdtemp(prefix="redis-phases-")).start()
        url = server.url
    try:
        kinds = [k for k in args.lookups.split(",") if k]
        bare = asyncio.run(
            measure(url, variants, args.rounds, args.warmup, args.seed, kinds, args.concurrency)
        )
    finally:
        if server is not None:
            server.stop()
    print(report(variants, bare, args.rounds, (load_start, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
