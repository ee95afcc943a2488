"""Synthetic cache entries for `semserve bench scale`, written in cache.store's stored format
(hash fields of cache.schema, tenant sorted set, tenants hash, TTL), and the index built over them."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

DEPLOYMENT = "bench_scale"
SERVER_TENANT = "default"  # the transformer's tenant when auth is off
SERVER_MAX_TOKENS = 8
PIPELINE_BATCH = 2000
TTL_S = 86400
ANSWER = json.dumps({"text": "a synthetic answer of a few words", "finish_reason": "length",
                     "completion_tokens": 8, "prompt_tokens": 6})


def server_request(prompt: str, tenant: str = SERVER_TENANT) -> object:
    """The CacheRequest the transformer builds for a v2 REST completion with the bench's
    parameters (max_tokens, temperature 0, no revision): checked against the server at run time."""
    from cache.keys import CacheRequest, SamplingKey
    from semserve.sampling import parse_sampling

    options = parse_sampling({"max_tokens": SERVER_MAX_TOKENS, "temperature": 0})
    return CacheRequest(tenant=tenant, model="llm", kind="completion", prompt=prompt,
                        sampling=SamplingKey.from_mapping(options.to_dict()))


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
        put(pipe, schema, Entry(names[t], t_tags[t], m_tag, scopes[t], exact_id(names[t], fp, prompt),
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
    """Queue one entry as EntryStore.put stores it (hash, TTL, tenant sorted set)."""
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


def exact_id(tenant: str, fp: str, prompt: str) -> str:
    # cache.keys.exact_key with the fingerprint computed once (it is the same for every entry);
    # the test checks the two agree.
    from cache.keys import canonical_json, normalize_text

    h = hashlib.sha256(b"semserve-exact")
    h.update(b"\x00")
    h.update(canonical_json([tenant, fp, normalize_text(prompt)]).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def request_fingerprint(schema: object) -> str:
    """cache.keys.fingerprint of the bench's requests (one for every entry)."""
    from cache import keys

    return keys.fingerprint(server_request("x"), schema.version)  # type: ignore[attr-defined, arg-type]

def index_info(client: object, index: str) -> dict[str, object]:
    """FT.INFO as a dict (RESP2 lists and RESP3 maps alike)."""
    raw = client.execute_command("FT.INFO", index)  # type: ignore[attr-defined]
    if isinstance(raw, dict):
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    it = iter(raw)
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in zip(it, it, strict=False)}


def as_number(x: object) -> float:
    return float(x.decode() if isinstance(x, bytes) else x)  # type: ignore[arg-type]


def build_index(client: object, schema: object, timeout_s: float) -> float:
    """FT.CREATE over the written keys; seconds until indexing is done."""
    t0 = time.monotonic()
    client.ft(schema.index_name).create_index(  # type: ignore[attr-defined]
        schema.fields(), definition=schema.definition()  # type: ignore[attr-defined]
    )
    while True:
        info = index_info(client, schema.index_name)  # type: ignore[attr-defined]
        if as_number(info.get("percent_indexed", 1)) >= 1.0 and int(as_number(info.get("indexing", 0))) == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"index not built in {timeout_s:.0f} s")
        time.sleep(0.05)
