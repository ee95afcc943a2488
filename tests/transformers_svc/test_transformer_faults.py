"""The transformer when things fail, and auth: Redis killed and restarted, predictor unreachable,
keys on every route, tenants apart."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from kserve import InferenceGRPCClient, InferInput, InferRequest

from tests.conftest import Predictor, start_transformer
from tests.support import TcpProxy, free_port, metric_value
from transformers_svc.auth import hash_key


def v2_body(prompt: str) -> dict:
    return {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": {"max_tokens": 8, "temperature": 0},
    }


def status(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return next(o for o in r.json()["outputs"] if o["name"] == "cache_status")["data"][0]


def test_redis_killed_then_restarted(predictor: Predictor, tmp_path: Path) -> None:
    from semserve.tooling.local_redis import RedisServer

    port = free_port()
    redis = RedisServer(port, data_dir=tmp_path / "r1").start()
    t = start_transformer("redis-fault", predictor.grpc, redis.url)
    url = f"{t.http}/v2/models/llm/infer"
    try:
        q = f"Name a metal ({uuid.uuid4().hex[:6]})."
        assert status(httpx.post(url, json=v2_body(q), timeout=60)) == "miss"
        assert status(httpx.post(url, json=v2_body(q), timeout=60)) == "exact"
        redis.stop()
        # Redis down: every request is still answered, from the predictor, without error.
        for i in range(3):
            started = time.monotonic()
            r = httpx.post(url, json=v2_body(f"{q} {i}"), timeout=60)
            assert status(r) == "miss"
            assert time.monotonic() - started < 30
        text = httpx.get(f"{t.http}/metrics").text
        assert metric_value(text, "semserve_cache_lookups_total", result="error") >= 1
        assert metric_value(text, "semserve_cache_degraded") == 1
        # Redis back, empty: the index is recreated and caching resumes without a restart.
        redis = RedisServer(port, data_dir=tmp_path / "r2").start()
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            seen.append(status(httpx.post(url, json=v2_body(q), timeout=60)))
            if seen[-1] == "exact":
                break
            time.sleep(1.2)
        assert seen[-1] == "exact", seen
        assert metric_value(httpx.get(f"{t.http}/metrics").text, "semserve_cache_degraded") == 0
    finally:
        t.process.stop()
        redis.stop()


def test_predictor_down_hits_served_misses_503(predictor: Predictor, redis_url: str) -> None:
    grpc_port = int(predictor.grpc.rsplit(":", 1)[1])
    grpc_proxy = TcpProxy(grpc_port).start()
    t = start_transformer(
        "predictor-fault", f"127.0.0.1:{grpc_proxy.port}", redis_url, "--predictor-timeout-s", "10",
    )
    url = f"{t.http}/v2/models/llm/infer"
    chat_url = f"{t.openai_base}/chat/completions"
    q = f"Name a river ({uuid.uuid4().hex[:6]})."
    chat_body = {"model": "llm", "temperature": 0, "max_tokens": 8,
                 "messages": [{"role": "user", "content": q}]}
    try:
        assert status(httpx.post(url, json=v2_body(q), timeout=60)) == "miss"
        assert httpx.post(chat_url, json=chat_body, timeout=60).status_code == 200
        grpc_proxy.stop()
        # Hits are still served with the predictor gone ...
        assert status(httpx.post(url, json=v2_body(q), timeout=60)) == "exact"
        hit = httpx.post(chat_url, json=chat_body, timeout=60)
        assert hit.status_code == 200 and hit.headers["x-semserve-cache"] == "exact"
        # ... misses get a clear 503 quickly, never a hang, on every protocol.
        started = time.monotonic()
        other = f"Explain photosynthesis step by step ({uuid.uuid4().hex[:6]})."
        miss = httpx.post(url, json=v2_body(other), timeout=60)
        assert miss.status_code == 503 and "predictor" in miss.text
        chat_miss = httpx.post(chat_url, json={**chat_body, "messages": [
            {"role": "user", "content": "Why is the sky blue?"}]}, timeout=60)
        assert chat_miss.status_code == 503
        stream_miss = httpx.post(chat_url, json={**chat_body, "stream": True, "messages": [
            {"role": "user", "content": "How do volcanoes form?"}]}, timeout=60)
        assert stream_miss.status_code == 503
        assert time.monotonic() - started < 30

        async def grpc_miss() -> grpc.StatusCode:
            client = InferenceGRPCClient(t.grpc, timeout=30, retries=0)
            try:
                await client.infer(InferRequest("llm", [InferInput("text_input", [1], "BYTES", ["zzz"])],
                                                parameters={"max_tokens": 2}))
                return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as err:
                return err.code()
            finally:
                await client.close()

        import asyncio

        assert asyncio.run(grpc_miss()) == grpc.StatusCode.UNAVAILABLE
        # Nothing wrong was stored: after recovery the failed prompt is a miss that succeeds.
        grpc_proxy = TcpProxy(grpc_port, grpc_proxy.port).start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = httpx.post(url, json=v2_body(other), timeout=60)
            if r.status_code == 200:
                break
            time.sleep(0.5)
        assert status(r) == "miss"
    finally:
        t.process.stop()
        grpc_proxy.stop()


@pytest.fixture(scope="module")
def secured(predictor: Predictor, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("keys")
    keys = {"acme": [hash_key("key-acme")], "globex": [hash_key("key-glx")]}
    (d / "keys.json").write_text(json.dumps(keys))
    (d / "admin.json").write_text(json.dumps([hash_key("key-admin")]))
    t = start_transformer("auth", predictor.grpc, redis_url,
                          "--api-keys-file", str(d / "keys.json"), "--admin-keys-file", str(d / "admin.json"))
    yield t
    t.process.stop()


def test_auth_required_on_every_route(secured) -> None:
    t = secured
    assert httpx.get(f"{t.http}/v2/health/ready").status_code == 200  # probes stay open
    assert httpx.post(f"{t.http}/v2/models/llm/infer", json=v2_body("hi")).status_code == 401
    assert httpx.get(f"{t.http}/v2/models/llm").status_code == 401
    assert httpx.get(f"{t.openai_base}/models").status_code == 401
    bad = httpx.post(f"{t.openai_base}/chat/completions", headers={"authorization": "Bearer nope"},
                     json={"model": "llm", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 401 and "API key" in bad.json()["error"]["message"]
    ok = httpx.get(f"{t.openai_base}/models", headers={"authorization": "Bearer key-acme"})
    assert ok.status_code == 200
    assert httpx.get(f"{t.openai_base}/models", headers={"x-api-key": "key-glx"}).status_code == 200

    async def grpc_codes() -> list[grpc.StatusCode]:
        codes = []
        for md in (None, (("authorization", "Bearer key-acme"),)):
            async with grpc.aio.insecure_channel(t.grpc) as ch:
                from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
                from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

                stub = pb_grpc.GRPCInferenceServiceStub(ch)
                try:
                    await stub.ModelMetadata(pb.ModelMetadataRequest(name="llm"), metadata=md)
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as err:
                    codes.append(err.code())
        return codes

    import asyncio

    assert asyncio.run(grpc_codes()) == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK]


def test_tenants_never_share_entries(secured) -> None:
    t = secured
    q = f"Name a mountain ({uuid.uuid4().hex[:6]})."
    url = f"{t.http}/v2/models/llm/infer"
    acme = {"authorization": "Bearer key-acme"}
    # Headers a client might use to claim another tenant are ignored: the key decides.
    glx = {"authorization": "Bearer key-glx", "x-tenant": "acme", "x-semserve-tenant": "acme"}
    assert status(httpx.post(url, json=v2_body(q), headers=acme, timeout=60)) == "miss"
    assert status(httpx.post(url, json=v2_body(q), headers=glx, timeout=60)) == "miss"
    assert status(httpx.post(url, json=v2_body(q), headers=acme, timeout=60)) == "exact"
    assert status(httpx.post(url, json=v2_body(q), headers=glx, timeout=60)) == "exact"


def test_admin_routes_need_an_admin_key(secured) -> None:
    t = secured
    assert httpx.get(f"{t.http}/admin/cache/stats").status_code == 401
    r = httpx.get(f"{t.http}/admin/cache/stats", headers={"authorization": "Bearer key-acme"})
    assert r.status_code == 403
    r = httpx.get(f"{t.http}/admin/cache/stats?tenant=acme", headers={"authorization": "Bearer key-admin"})
    assert r.status_code == 200 and "counters" in r.json()
    r = httpx.get(f"{t.http}/admin/cache/inspect?tenant=acme", headers={"x-api-key": "key-admin"})
    assert r.status_code == 200 and isinstance(r.json()["entries"], list)
    r = httpx.post(f"{t.http}/admin/cache/flush?tenant=globex", headers={"x-api-key": "key-admin"})
    assert r.status_code == 200 and r.json()["deleted"] >= 1
    r = httpx.post(f"{t.http}/admin/cache/flush", headers={"x-api-key": "key-admin"})
    assert r.status_code == 400
