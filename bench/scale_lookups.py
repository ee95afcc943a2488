"""What `semserve bench scale` measures at one cache size: the store's exact and KNN lookups in
process (with recall@1), and exact and semantic hits through a transformer."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.predictor import _percentile
from bench.scale_entries import (
    ANSWER,
    SERVER_MAX_TOKENS,
    SERVER_TENANT,
    Entry,
    exact_id,
    put,
    request_fingerprint,
    server_request,
    synthetic_prompt,
    tenant_names,
)


@dataclass
class Latency:
    samples_ms: list[float] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return _percentile(self.samples_ms, 0.50) if self.samples_ms else float("nan")

    @property
    def p99(self) -> float:
        return _percentile(self.samples_ms, 0.99) if self.samples_ms else float("nan")


@dataclass
class ScaleRow:
    """Figures for one cache size."""

    entries: int
    tenants: int
    hnsw: str  # "M/EF_CONSTRUCTION/EF_RUNTIME(index default)"
    write_s: float = 0.0
    index_s: float = 0.0
    data_bytes_per_entry: float = 0.0
    total_bytes_per_entry: float = 0.0
    vector_index_mb: float = 0.0
    exact: Latency = field(default_factory=Latency)
    # EF_RUNTIME -> latency and recall@1 of the in-process KNN
    knn: dict[int, Latency] = field(default_factory=dict)
    recall: dict[int, float] = field(default_factory=dict)
    server_exact: Latency = field(default_factory=Latency)
    server_semantic: Latency = field(default_factory=Latency)
    server_failures: dict[str, int] = field(default_factory=dict)  # "kind: status" -> count


async def measure_in_process(
    redis_url: str, schema: object, row: ScaleRow, vectors: np.ndarray, ef_values: Sequence[int],
    queries: int, rng: random.Random, noise: float,
) -> None:
    """Exact lookups of stored entries, and KNN of noisy copies of stored vectors, calls
    interleaved; recall@1 against brute force over the tenant's own vectors."""
    from cache.entry_store import EntryStore, make_client
    from cache.settings import CacheSettings

    names = tenant_names(row.tenants)
    fp = request_fingerprint(schema)
    client = make_client(CacheSettings(redis_url=redis_url))  # the client the cache itself uses
    store = EntryStore(client, schema)  # type: ignore[arg-type]
    nrng = np.random.default_rng(rng.randrange(2**31))
    hits = dict.fromkeys(ef_values, 0)
    row.knn = {ef: Latency() for ef in ef_values}
    warmup = 20
    try:
        for q in range(queries + warmup):
            i = rng.randrange(row.entries)
            t = i % row.tenants
            req = server_request(synthetic_prompt(i), names[t])
            t0 = time.perf_counter()
            got = await store.get_exact(req)  # type: ignore[arg-type]
            dt = (time.perf_counter() - t0) * 1000
            if got is None:
                raise RuntimeError(f"exact lookup of stored entry {i} missed")
            if q >= warmup:
                row.exact.samples_ms.append(dt)
            g = nrng.standard_normal(vectors.shape[1]).astype(np.float32)
            qv = vectors[i] + noise * g / np.linalg.norm(g)  # noise 0.5: cosine ~0.89 to the source
            qv /= np.linalg.norm(qv)
            own = vectors[t : row.entries : row.tenants]
            want = exact_id(names[t], fp, synthetic_prompt(t + row.tenants * int(np.argmax(own @ qv))))
            for ef in ef_values:
                t0 = time.perf_counter()
                top = await _knn_top(store, req, qv, ef)
                dt = (time.perf_counter() - t0) * 1000
                if q >= warmup:
                    row.knn[ef].samples_ms.append(dt)
                    hits[ef] += int(top == want)
    finally:
        await client.aclose()
    row.recall = {ef: hits[ef] / max(1, queries) for ef in ef_values}


async def _knn_top(store: object, req: object, vector: np.ndarray, ef: int) -> str | None:
    """Id of the nearest entry. ef 0: EntryStore.search itself (the cache's own call, the
    index's EF_RUNTIME); ef > 0: the same query with EF_RUNTIME given on it."""
    if ef <= 0:
        cands = await store.search(req, vector, 5)  # type: ignore[attr-defined]
        return cands[0].entry_id if cands else None
    from redis.commands.search.query import Query

    from cache.schema import F_PROMPT, F_VECTOR

    s = store.schema  # type: ignore[attr-defined]
    filt = store._filter(req)  # type: ignore[attr-defined]
    query = (Query(f"{filt}=>[KNN 5 @{F_VECTOR} $vec EF_RUNTIME {int(ef)} AS dist]")
             .return_fields(F_PROMPT, "dist").sort_by("dist", asc=True).paging(0, 5).dialect(2))
    res = await store.client.ft(s.index_name).search(  # type: ignore[attr-defined]
        query, query_params={"vec": vector.astype(np.float32).tobytes()}
    )
    return res.docs[0].id.removeprefix(s.entry_prefix) if res.docs else None


# Real prompts for the server part: semantic hits embed them in the transformer.
SERVER_PROMPTS = (
    "Why is the sky blue?", "How do I boil an egg?", "What is the capital of France?",
    "Explain photosynthesis in one sentence.", "How many legs does a spider have?",
    "What does HTTP stand for?", "Give me a synonym for happy.", "How far is the moon from Earth?",
    "Who wrote Pride and Prejudice?", "What is the boiling point of water?",
    "How do I reverse a list in Python?", "What causes rain?", "Name three primary colors.",
    "What is a prime number?", "How long is a marathon?", "Why do cats purr?",
)


def seed_server_entries(redis_url: str, schema: object, fp: str) -> tuple[list[str], list[str]]:
    """Entries of the server's tenant for its hits. Exact: stored under the prompt's own key.
    Semantic: stored under the key of another prompt, with the query's text and real embedding,
    so the exact layer misses and the KNN finds it at similarity ~1 (verifier accepts)."""
    import redis

    from cache import keys
    from cache.embedder import Embedder, EmbedderSettings

    embedder = Embedder(EmbedderSettings(lru_size=0))
    vectors = embedder.embed_many(list(SERVER_PROMPTS))
    exact = [f"{p} (exact {j})" for j, p in enumerate(SERVER_PROMPTS)]
    t_tag, m_tag = keys.tenant_tag(SERVER_TENANT), keys.model_tag("llm")
    scope = keys.scope_tag_from_fingerprint(SERVER_TENANT, fp)
    client = redis.Redis.from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    now = time.time()
    for p, v, e in zip(SERVER_PROMPTS, vectors, exact, strict=True):
        put(pipe, schema, Entry(SERVER_TENANT, t_tag, m_tag, scope, exact_id(SERVER_TENANT, fp, e), e,
                                np.asarray(v)), ANSWER, now)
        other = exact_id(SERVER_TENANT, fp, f"{p} stored under another key")
        put(pipe, schema, Entry(SERVER_TENANT, t_tag, m_tag, scope, other, p, np.asarray(v)), ANSWER, now)
    pipe.execute()
    client.close()
    return exact, list(SERVER_PROMPTS)


def measure_server(base: str, exact: Sequence[str], semantic: Sequence[str], requests: int,
                   row: ScaleRow) -> None:
    """v2 REST at concurrency 1 (one keep-alive connection), exact and semantic interleaved."""
    import httpx

    def call(http: httpx.Client, prompt: str) -> tuple[float, str]:
        body = {
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": SERVER_MAX_TOKENS, "temperature": 0},
        }
        t0 = time.perf_counter()
        r = http.post(f"{base}/v2/models/llm/infer", json=body)
        dt = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:  # e.g. 503: the lookup failed (timeout) and no predictor is there
            return dt, f"HTTP {r.status_code}"
        status = next((str(o["data"][0]) for o in r.json()["outputs"] if o["name"] == "cache_status"), "?")
        return dt, status

    with httpx.Client(timeout=30) as http:
        for q in range(requests + 20):  # the first 20: warm-up
            for prompts, want, lat in ((exact, "exact", row.server_exact),
                                       (semantic, "semantic", row.server_semantic)):
                dt, status = call(http, prompts[q % len(prompts)])
                if status == want:
                    if q >= 20:
                        lat.samples_ms.append(dt)
                    continue
                if q == 0 and want == "exact":
                    raise RuntimeError(f"server answered {status!r} for an exact hit; the bench's "
                                       "request key no longer matches the transformer's")
                # Not a hit (e.g. a KNN past the lookup budget): counted, not timed.
                row.server_failures[f"{want}: {status}"] = row.server_failures.get(f"{want}: {status}", 0) + 1
