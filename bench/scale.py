"""`semserve bench scale`: what a lookup costs, and what an entry weighs, as the cache grows.

For each N in --entries, on a fresh local Redis with RediSearch (free port):

1. fill: N synthetic entries spread over T tenants, written with pipelines in the stored format of
   cache.store (hash fields of cache.schema, tenant sorted set, tenants hash, TTL), random unit
   vectors, no model calls. All share one model and fingerprint (the one a v2 request of the
   server part makes), so a tenant's scope tag (the KNN filter) selects its N/T entries.
2. index: FT.CREATE (cache.schema) after the writes, timed until FT.INFO says indexing is done:
   the build time of a restarted or rebuilt index. Redis used_memory before and after gives
   bytes per entry (data, and data + index).
3. in process: the store's exact lookup (HMGET) and KNN (FT.SEARCH through RedisCacheStore), p50
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
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.predictor import ROOT, _free_port, _machine, _percentile

LOG_DIR = ROOT / ".cache" / "bench-logs"
DEPLOYMENT = "bench_scale"
SERVER_TENANT = "default"  # the transformer's tenant when auth is off
SERVER_MAX_TOKENS = 8
PIPELINE_BATCH = 2000
TTL_S = 86400
ANSWER = json.dumps({"text": "a synthetic answer of a few words", "finish_reason": "length",
                     "completion_tokens": 8, "prompt_tokens": 6})


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


# ---------------------------------------------------------------------------------------------
# Fill


def server_request(prompt: str, tenant: str = SERVER_TENANT) -> object:
    """The CacheRequest the transformer builds for a v2 REST completion with the bench's
    parameters (max_tokens, temperature 0, no revision): checked against the server at run time."""
    from cache.keys import CacheRequest, SamplingParams
    from semserve.sampling import parse_sampling

    options = parse_sampling({"max_tokens": SERVER_MAX_TOKENS, "temperature": 0})
    return CacheRequest(tenant=tenant, model="llm", kind="completion", prompt=prompt,
                        sampling=SamplingParams.from_mapping(options.to_dict()))


def tenant_names(tenants: int) -> list[str]:
    return [SERVER_TENANT, *(f"tenant-{i}" for i in range(1, tenants))]


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def synthetic_prompt(i: int) -> str:
    return f"synthetic prompt number {i}"


def fill(client: object, schema: object, n: int, tenants: int, vectors: np.ndarray) -> None:
    """Write N entries in the stored format; entry i belongs to tenant i % T. Entry ids are the
    real exact keys (cache.keys.exact_key), so exact lookups find them."""
    from cache import keys

    names = tenant_names(tenants)
    template = server_request("x")
    fp = keys.fingerprint(template, schema.version)  # type: ignore[attr-defined, arg-type]
    m_tag = keys.model_tag(template.model)  # type: ignore[attr-defined]
    t_tags = [keys.tenant_tag(t) for t in names]
    scopes = [keys.scope_tag_from_fingerprint(t, fp) for t in names]
    answer = ANSWER
    now = time.time()
    pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
    pipe.hset(schema.tenants_key, mapping=dict(zip(t_tags, names, strict=True)))  # type: ignore[attr-defined]
    for i in range(n):
        t = i % tenants
        prompt = synthetic_prompt(i)
        put(pipe, schema, Entry(names[t], t_tags[t], m_tag, scopes[t], _exact_id(names[t], fp, prompt),
                                prompt, vectors[i]), answer, now)
        if (i + 1) % PIPELINE_BATCH == 0:
            pipe.execute()
    pipe.execute()


@dataclass(frozen=True)
class Entry:
    tenant: str
    tenant_tag: str
    model_tag: str
    scope_tag: str  # cache.keys.scope_tag: the KNN's filter
    entry_id: str
    prompt: str
    vector: np.ndarray


def put(pipe: object, schema: object, e: Entry, answer: str, now: float) -> None:
    """Queue one entry as RedisCacheStore.put stores it (hash, TTL, tenant sorted set)."""
    from cache import schema as s

    key = schema.entry_key(e.entry_id)  # type: ignore[attr-defined]
    pipe.hset(key, mapping={  # type: ignore[attr-defined]
        s.F_VECTOR: e.vector.astype(np.float32).tobytes(), s.F_TENANT: e.tenant_tag, s.F_MODEL: e.model_tag,
        s.F_SCOPE: e.scope_tag, s.F_KIND: "completion", s.F_CREATED_AT: now,
        s.F_ANSWER: answer, s.F_PROMPT: e.prompt, s.F_TENANT_NAME: e.tenant, s.F_MODEL_NAME: "llm",
    })
    pipe.pexpire(key, TTL_S * 1000)  # type: ignore[attr-defined]
    zkey = schema.tenant_zset_key(e.tenant_tag)  # type: ignore[attr-defined]
    pipe.zadd(zkey, {e.entry_id: int(now * 1e6)})  # type: ignore[attr-defined]


def _exact_id(tenant: str, fp: str, prompt: str) -> str:
    # cache.keys.exact_key with the fingerprint computed once (it is the same for every entry);
    # the test checks the two agree.
    from cache.keys import canonical_json, normalize_text

    h = hashlib.sha256(b"semserve-exact")
    h.update(b"\x00")
    h.update(canonical_json([tenant, fp, normalize_text(prompt)]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _info(client: object, index: str) -> dict[str, object]:
    raw = client.execute_command("FT.INFO", index)  # type: ignore[attr-defined]
    if isinstance(raw, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    it = iter(raw)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in zip(it, it, strict=False)}


def _num(x: object) -> float:
    return float(x.decode() if isinstance(x, bytes) else x)  # type: ignore[arg-type]


def build_index(client: object, schema: object, timeout_s: float) -> float:
    """FT.CREATE over the written keys; seconds until indexing is done."""
    t0 = time.monotonic()
    client.ft(schema.index_name).create_index(  # type: ignore[attr-defined]
        schema.fields(), definition=schema.definition()  # type: ignore[attr-defined]
    )
    while True:
        info = _info(client, schema.index_name)  # type: ignore[attr-defined]
        if _num(info.get("percent_indexed", 1)) >= 1.0 and int(_num(info.get("indexing", 0))) == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"index not built in {timeout_s:.0f} s")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# In process


async def measure_in_process(
    redis_url: str, schema: object, row: ScaleRow, vectors: np.ndarray, ef_values: Sequence[int],
    queries: int, rng: random.Random, noise: float,
) -> None:
    """Exact lookups of stored entries, and KNN of noisy copies of stored vectors, calls
    interleaved; recall@1 against brute force over the tenant's own vectors."""
    from cache.settings import CacheSettings
    from cache.store import RedisCacheStore, make_client

    names = tenant_names(row.tenants)
    fp = _fp(schema)
    client = make_client(CacheSettings(redis_url=redis_url))  # the client the cache itself uses
    store = RedisCacheStore(client, schema)  # type: ignore[arg-type]
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
            want = _exact_id(names[t], fp, synthetic_prompt(t + row.tenants * int(np.argmax(own @ qv))))
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


def _fp(schema: object) -> str:
    from cache import keys

    return keys.fingerprint(server_request("x"), schema.version)  # type: ignore[attr-defined, arg-type]


async def _knn_top(store: object, req: object, vector: np.ndarray, ef: int) -> str | None:
    """Id of the nearest entry. ef 0: RedisCacheStore.search itself (the cache's own call, the
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


# ---------------------------------------------------------------------------------------------
# Through the server

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
        put(pipe, schema, Entry(SERVER_TENANT, t_tag, m_tag, scope, _exact_id(SERVER_TENANT, fp, e), e,
                                np.asarray(v)), ANSWER, now)
        other = _exact_id(SERVER_TENANT, fp, f"{p} stored under another key")
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


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


# ---------------------------------------------------------------------------------------------
# One size


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
        row.vector_index_mb = _num(_info(client, schema.index_name).get("vector_index_sz_mb", 0))
        client.close()
        print(f"  index built in {row.index_s:.1f} s; {row.total_bytes_per_entry:,.0f} B/entry; "
              f"in-process lookups ({args.queries})", flush=True)
        ef_values = [0, *(int(x) for x in str(args.ef_runtime).split(",") if x and int(x) > 0)]
        asyncio.run(measure_in_process(server.url, schema, row, vectors, ef_values, args.queries, rng,
                                       args.noise))
        del vectors
        if not args.skip_server:
            print("  through the server (v2 REST, concurrency 1)", flush=True)
            exact, semantic = seed_server_entries(server.url, schema, _fp(schema))
            transformer, base = start_transformer(server.url, args.transformer_arg)
            measure_server(base, exact, semantic, args.server_requests, row)
    finally:
        if transformer is not None:
            stop_process(transformer)
        server.stop()
    return row


# ---------------------------------------------------------------------------------------------
# Output


def _f(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"  # NaN: not measured


def table(rows: Sequence[ScaleRow]) -> str:
    head = ("| entries | tenants | index (HNSW M/EFC/EFR) | write s | index build s | B/entry (data) | "
            "B/entry (with index) | exact p50/p99 ms | KNN p50/p99 ms | KNN recall@1 | "
            "server exact p50/p99 ms | server semantic p50/p99 ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        knn = r.knn.get(0, Latency())
        lines.append(
            f"| {r.entries:,} | {r.tenants:,} | {r.hnsw} | {r.write_s:.1f} | {r.index_s:.1f} | "
            f"{r.data_bytes_per_entry:,.0f} | {r.total_bytes_per_entry:,.0f} | "
            f"{_f(r.exact.p50)} / {_f(r.exact.p99)} | {_f(knn.p50)} / {_f(knn.p99)} | "
            f"{r.recall.get(0, float('nan')):.3f} | {_f(r.server_exact.p50)} / {_f(r.server_exact.p99)} | "
            f"{_f(r.server_semantic.p50)} / {_f(r.server_semantic.p99)} |"
        )
    for r in rows:
        if r.server_failures:
            lines.append("")
            lines.append(f"{r.entries:,} entries: server answers that were not the expected hit "
                         f"(not timed): {', '.join(f'{k} x{v}' for k, v in r.server_failures.items())}")
    return "\n".join(lines)


def ef_table(rows: Sequence[ScaleRow]) -> str:
    lines = ["| entries | tenants | HNSW M/EFC | EF_RUNTIME | KNN p50 ms | KNN p99 ms | recall@1 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for ef, lat in sorted(r.knn.items()):
            if ef == 0:
                continue
            lines.append(f"| {r.entries:,} | {r.tenants:,} | {r.hnsw.rsplit('/', 1)[0]} | {ef} | "
                         f"{_f(lat.p50)} | {_f(lat.p99)} | {r.recall[ef]:.3f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(rows: Sequence[ScaleRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.entries for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [
        ("exact lookup (in process)", [r.exact.p50 for r in rows]),
        ("KNN (in process)", [r.knn.get(0, Latency()).p50 for r in rows]),
        ("exact hit (server, v2 REST)", [r.server_exact.p50 for r in rows]),
        ("semantic hit (server, v2 REST)", [r.server_semantic.p50 for r in rows]),
    ]
    for label, ys in series:
        if any(y == y for y in ys):
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("entries in the cache")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title(f"semserve lookup latency vs cache size ({rows[0].tenants if rows else 0} tenants max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command_line(args: argparse.Namespace) -> str:
    parts = [f"semserve bench scale --entries {args.entries} --tenants {args.tenants}",
             f"--queries {args.queries}"]
    if args.algorithm != "FLAT":
        parts.append(f"--algorithm {args.algorithm}")
    if args.hnsw_m:
        parts.append(f"--hnsw-m {args.hnsw_m}")
    if args.ef_construction:
        parts.append(f"--ef-construction {args.ef_construction}")
    if args.ef_runtime:
        parts.append(f"--ef-runtime {args.ef_runtime}")
    if args.ef_runtime_default:
        parts.append(f"--ef-runtime-default {args.ef_runtime_default}")
    parts.append("--skip-server" if args.skip_server else f"--server-requests {args.server_requests}")
    return " ".join(parts)


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
                f"the store's HMGET and KNN (RedisCacheStore), {args.queries} lookups each, "
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
