"""Tenants apart, against a client that tries: with tenant A's key, every header, query parameter,
request parameter, body field and gRPC metadata a client can set to name tenant B changes nothing;
A cannot read, flush or write B's entries through any route; and 10,000 random requests across
tenants at the cache-policy level never cross.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from cache import keys
from cache.entry_store import EntryStore
from cache.keys import CacheRequest, SamplingKey
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings
from semserve.v2 import grpc_tensors as tensors
from tests.cache.doubles import HashingEmbedderDouble, ThresholdVerifierDouble
from tests.conftest import Predictor, Transformer, start_transformer
from transformers_svc.auth import hash_key

A_KEY, B_KEY, ADMIN_KEY = "key-tenant-a", "key-tenant-b", "key-admin-x"
A, B = "tenant-a", "tenant-b"
# Every header a client might hope names the tenant.
CLAIM_HEADERS = {
    "x-tenant": B, "x-semserve-tenant": B, "x-tenant-id": B, "tenant": B, "x-kserve-tenant": B,
    "x-forwarded-user": B, "x-remote-user": B, "x-user": B, "x-org": B, "openai-organization": B,
    "x-api-key": B_KEY,  # a second key beside A's bearer: the bearer decides
}


@pytest.fixture(scope="module")
def secured(predictor: Predictor, redis_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Transformer]:
    d = tmp_path_factory.mktemp("tenant-keys")
    (d / "keys.json").write_text(json.dumps({A: [hash_key(A_KEY)], B: [hash_key(B_KEY)]}))
    (d / "admin.json").write_text(json.dumps([hash_key(ADMIN_KEY)]))
    t = start_transformer("tenant-sec", predictor.grpc, redis_url,
                          "--api-keys-file", str(d / "keys.json"),
                          "--admin-keys-file", str(d / "admin.json"))
    yield t
    t.process.stop()


def _v2(prompt: str, **params: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": 3, "temperature": 0, **params}}


def _status(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return next(o for o in r.json()["outputs"] if o["name"] == "cache_status")["data"][0]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _count(t: Transformer, tenant: str) -> int:
    r = httpx.get(f"{t.http}/admin/cache/stats", params={"tenant": tenant}, headers=_bearer(ADMIN_KEY))
    assert r.status_code == 200, r.text
    return int(r.json()["tenants"][tenant])


def test_a_key_cannot_claim_b_over_http(secured: Transformer) -> None:
    t = secured
    infer = f"{t.http}/v2/models/llm/infer"
    chat = f"{t.openai_base}/chat/completions"
    cmpl = f"{t.openai_base}/completions"

    def seeded(tag: str) -> str:
        # A prompt B has asked (so B has an entry for it) and A never has.
        q = f"Name a planet ({tag} {uuid.uuid4().hex[:6]})."
        assert _status(httpx.post(infer, json=_v2(q), headers=_bearer(B_KEY), timeout=60)) == "miss"
        assert _status(httpx.post(infer, json=_v2(q), headers=_bearer(B_KEY), timeout=60)) == "exact"
        return q

    b_before = _count(t, B)
    a_before = _count(t, A)
    attempts = 0
    # v2: headers, query parameters, request parameters, sampling_parameters JSON.
    q = seeded("headers")
    r = httpx.post(infer, json=_v2(q), headers={**_bearer(A_KEY), **CLAIM_HEADERS}, timeout=60)
    assert _status(r) == "miss"
    attempts += 1
    q = seeded("query")
    r = httpx.post(infer, params={"tenant": B, "x-tenant": B, "api_key": B_KEY}, json=_v2(q),
                   headers=_bearer(A_KEY), timeout=60)
    assert _status(r) == "miss"
    attempts += 1
    q = seeded("params")
    r = httpx.post(infer, json=_v2(q, tenant=B, x_tenant=B, user=B), headers=_bearer(A_KEY), timeout=60)
    assert _status(r) == "miss"
    attempts += 1
    q = seeded("sampling")
    body = _v2(q)
    body["inputs"].append({"name": "sampling_parameters", "datatype": "BYTES", "shape": [1],
                           "data": [json.dumps({"tenant": B, "max_tokens": 3, "temperature": 0})]})
    assert _status(httpx.post(infer, json=body, headers=_bearer(A_KEY), timeout=60)) == "miss"
    attempts += 1

    # OpenAI: `user`, unknown body fields, headers. v2 and completions share entries, so B's v2
    # entry is what a completions request naming B would find if the claim worked.
    q = seeded("openai")
    r = httpx.post(cmpl, json={"model": "llm", "prompt": q, "max_tokens": 3, "temperature": 0,
                               "user": B, "tenant": B, "metadata": {"tenant": B}},
                   headers={**_bearer(A_KEY), **CLAIM_HEADERS}, timeout=60)
    assert r.status_code == 200 and r.headers["x-semserve-cache"] == "miss", r.text
    attempts += 1
    q = seeded("openai-stream")
    with httpx.stream("POST", cmpl, json={"model": "llm", "prompt": q, "max_tokens": 3, "temperature": 0,
                                          "stream": True, "user": B},
                      headers={**_bearer(A_KEY), **CLAIM_HEADERS}, timeout=60) as r:
        r.read()
        assert r.status_code == 200 and r.headers["x-semserve-cache"] == "miss"
    attempts += 1
    # Chat: B asks, A claims B.
    msg = [{"role": "user", "content": f"Name a moon ({uuid.uuid4().hex[:6]})."}]
    chat_body = {"model": "llm", "messages": msg, "max_tokens": 3, "temperature": 0}
    assert httpx.post(chat, json=chat_body, headers=_bearer(B_KEY), timeout=60).status_code == 200
    r = httpx.post(chat, json={**chat_body, "user": B}, headers={**_bearer(A_KEY), **CLAIM_HEADERS},
                   timeout=60)
    assert r.status_code == 200 and r.headers["x-semserve-cache"] == "miss"
    attempts += 1

    # Nothing A did was stored under B: B's count grew only by B's own six seeds + one chat.
    assert _count(t, B) == b_before + 7
    assert _count(t, A) == a_before + attempts


def test_a_key_cannot_claim_b_over_grpc(secured: Transformer) -> None:
    t = secured
    q = f"Name a comet ({uuid.uuid4().hex[:6]})."

    def request(prompt: str, claim: bool) -> pb.ModelInferRequest:
        req = pb.ModelInferRequest(model_name="llm")
        inp = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        inp.contents.bytes_contents.append(prompt.encode())
        req.parameters["max_tokens"].int64_param = 3
        # KServe's gRPC parameters have no float: temperature travels in the JSON input.
        sp = req.inputs.add(name="sampling_parameters", datatype="BYTES", shape=[1])
        sp.contents.bytes_contents.append(json.dumps({"temperature": 0}).encode())
        if claim:
            req.parameters["tenant"].string_param = B
        return req

    async def call(key: str, claim: bool) -> str:
        md: list[tuple[str, str]] = [("authorization", f"Bearer {key}")]
        if claim:
            md += [(k, v) for k, v in CLAIM_HEADERS.items() if k != "x-api-key"]
        async with grpc.aio.insecure_channel(t.grpc) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            resp = await stub.ModelInfer(request(q, claim), metadata=md, timeout=60)
        # Outputs travel raw, as Triton sends them.
        return tensors.output_columns(resp)["cache_status"][0].decode()

    async def run() -> list[str]:
        return [await call(B_KEY, False), await call(B_KEY, False), await call(A_KEY, True)]

    assert asyncio.run(run()) == ["miss", "exact", "miss"]


def test_admin_routes_refuse_a_tenant_key(secured: Transformer) -> None:
    t = secured
    for key_headers in (_bearer(A_KEY), {"x-api-key": A_KEY}, {**_bearer(A_KEY), **CLAIM_HEADERS}):
        for method, path in (("GET", "stats"), ("GET", "inspect"), ("POST", "flush")):
            r = httpx.request(method, f"{t.http}/admin/cache/{path}", params={"tenant": B},
                              headers=key_headers)
            assert r.status_code == 403, (path, r.text)
    # No key, or an admin key offered where clients cannot put one (query string): 401.
    r = httpx.get(f"{t.http}/admin/cache/inspect", params={"tenant": B, "api_key": ADMIN_KEY})
    assert r.status_code == 401


# -- the exact key includes the tenant -----------------------------------------------------------------


def test_exact_key_includes_the_tenant() -> None:
    """A prompt cannot be crafted to hit B's exact-match entry: the key is
    sha256("semserve-exact" NUL canonical_json([tenant, fingerprint, normalized prompt])). The JSON
    array encoding is injective (every string is quoted and escaped, so no prompt can end the tenant's
    string early or move bytes into its slot), hence two requests share a key only if their tenants
    are equal strings, or sha256 collides. The entry id is that key, so it is also where it is stored."""
    base = dict(model="llm", kind="completion", sampling=SamplingKey(temperature=0.0))
    b_key = keys.exact_key(CacheRequest(tenant=B, prompt="hello", **base))  # type: ignore[arg-type]
    crafted = ['hello', f'{B}","hello', f'", "{B}', f'"{B}"', "\\", f'{A}\x00{B}', f'{B}\\"hello']
    for prompt in crafted:
        for tenant in (A, f'{A}","', f"{A}\\", f"{B} ", f"{B}\u200b", B.upper()):
            assert keys.exact_key(CacheRequest(tenant=tenant, prompt=prompt, **base)) != b_key  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, database=None)
@given(t1=st.text(min_size=1), p1=st.text(), t2=st.text(min_size=1), p2=st.text())
def test_exact_key_differs_for_different_tenants(t1: str, p1: str, t2: str, p2: str) -> None:
    base = dict(model="llm", kind="chat")
    k1 = keys.exact_key(CacheRequest(tenant=t1, prompt=p1, **base))  # type: ignore[arg-type]
    k2 = keys.exact_key(CacheRequest(tenant=t2, prompt=p2, **base))  # type: ignore[arg-type]
    if t1 != t2:
        assert k1 != k2
    assert keys.tenant_tag(t1) != keys.tenant_tag(t2) or t1 == t2


# -- 10,000 random requests at the policy level --------------------------------------------------------


async def test_ten_thousand_random_requests_never_cross_tenants(redis_url: str) -> None:
    """Random tenants x a shared pool of prompts (with paraphrases, so semantic hits happen too),
    lookup then store on a miss, each answer carrying its owner: every hit must be the requester's."""
    settings_ = CacheSettings(redis_url=redis_url, deployment=f"tenantmix{uuid.uuid4().hex[:6]}",
                              lookup_timeout_ms=5000.0, store_timeout_ms=5000.0, degraded_retry_s=0.05)
    store = EntryStore.from_settings(settings_)
    cache = SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings_)
    await cache.start()
    rng = random.Random(20261202)
    tenants = [f"t{i}" for i in range(12)] + ["@tenant:{*}", "t1|t2", "-t3", "t4*"]
    subjects = ["France", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt", "Canada"]
    # Case and punctuation variants have distinct exact keys but the same embedding (the double
    # lower-cases words), so they are semantic hits of each other.
    templates = ["What is the capital of {}?", "what is the capital of {}", "WHAT IS THE CAPITAL OF {}!",
                 "What language is spoken in {}?", "what language is spoken in {} ?", "How big is {}?"]
    pool = [t.format(s) for t in templates for s in subjects]
    hits = {"exact": 0, "semantic": 0}
    crossed: list[tuple[str, str, str]] = []
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        tenant, prompt = rng.choice(tenants), rng.choice(pool)
        req = CacheRequest(tenant=tenant, model="llm", kind="chat", prompt=prompt)
        async with sem:
            res = await cache.lookup(req)
            if res.hit:
                hits[res.status] += 1
                assert res.answer is not None
                if res.answer["tenant"] != tenant:
                    crossed.append((tenant, res.answer["tenant"], prompt))
            elif res.status == "miss":
                await cache.store(req, {"text": f"answer {i}", "tenant": tenant}, res.vector)

    try:
        for start in range(0, 10_000, 500):
            await asyncio.gather(*(one(i) for i in range(start, start + 500)))
        assert crossed == []
        assert cache.counters.lookups["error"] == 0, cache.counters
        # The test means something only if hits of both kinds happened.
        assert hits["exact"] > 1000 and hits["semantic"] > 10, hits
        assert sum(cache.counters.lookups.values()) == 10_000
    finally:
        for t in tenants:
            await store.flush(t)
        await cache.close()
