"""Per-tenant limits (issue 27) end to end: three transformer replicas on one Redis, the shared real
predictor, API keys mapping to tenants, real httpx, openai and gRPC clients.

One Redis and one set of three replicas serve every test of the module (started in parallel); each
test uses a tenant of its own, so their buckets never meet. Windows are never waited out: limits are
small, and the Retry-After and x-ratelimit-* values are checked instead. Redis is killed by the last
test (fail open).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

from semserve.tooling.local_redis import RedisServer
from semserve.v2 import inference_pb2 as oip
from semserve.v2.grpc_service import MODEL_STREAM_INFER
from tests.conftest import LOG_DIR, Predictor, Transformer, start_transformer
from tests.support import ServerProcess, free_port, metric_value
from transformers_svc.auth import hash_key

LIMITS = {
    "rpm": {"requests_per_minute": 100},  # three replicas share it
    "retry": {"requests_per_minute": 20},  # one request back every 3 s: the openai client's retry
    "tok": {"tokens_per_minute": 60},
    "conc": {"max_concurrent": 1},
    "both": {"requests_per_minute": 50, "tokens_per_minute": 5000},
    "flow": {"requests_per_minute": 1_000_000},  # always checked, never refused (fail open)
    "free": {},  # an entry of its own: no limits, not the default's
    "default": {"requests_per_minute": 3},  # "anon" has no entry
}
TENANTS = [*[t for t in LIMITS if t != "default"], "anon"]
RESET = re.compile(r"^(\d+h)?(\d+m)?\d+(\.\d+)?(ms|s)$")


def key(tenant: str) -> str:
    return f"key-{tenant}"


def chat_prompt(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Replicas:
    redis: RedisServer
    ts: list[Transformer]
    limits_dir: Path


@pytest.fixture(scope="module")
def replicas(predictor: Predictor, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    d = tmp_path_factory.mktemp("tenant-limits")
    (d / "keys.json").write_text(json.dumps({t: [hash_key(key(t))] for t in TENANTS}))
    (d / "limits.json").write_text(json.dumps(LIMITS))
    redis = RedisServer(free_port(), data_dir=d / "redis").start()
    run = uuid.uuid4().hex[:6]

    def start(i: int) -> Transformer:
        # One deployment (so one set of counters and one cache), one log per replica.
        return start_transformer(f"limits-{run}-{i}", predictor.grpc, redis.url,
                                 "--cache-deployment", f"limits-{run}",
                                 "--api-keys-file", str(d / "keys.json"),
                                 "--tenant-limits-file", str(d / "limits.json"))

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(start, i) for i in range(3)]
        started = [f.result() for f in futures]
    try:
        yield Replicas(redis, started, d)
    finally:
        for t in started:
            t.process.stop()
        redis.stop()


def v2_body(prompt: str, max_tokens: int = 1) -> dict[str, Any]:
    return {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": max_tokens, "temperature": 0}}


def v2(t: Transformer, tenant: str, prompt: str, client: httpx.Client | None = None) -> httpx.Response:
    c = client or httpx
    return c.post(f"{t.http}/v2/models/llm/infer", json=v2_body(prompt),
                  headers={"x-api-key": key(tenant)}, timeout=120)


def chat(t: Transformer, tenant: str, text: str, max_tokens: int = 8, stream: bool = False,
         route: str = "chat/completions") -> httpx.Response:
    body: dict[str, Any] = {"model": "llm", "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if route == "chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return httpx.post(f"{t.openai_base}/{route}", json=body,
                      headers={"authorization": f"Bearer {key(tenant)}"}, timeout=120)


def metrics_of(t: Transformer) -> str:
    return httpx.get(f"{t.http}/metrics", timeout=10).text


def predictor_calls(t: Transformer) -> float:
    return metric_value(metrics_of(t), "semserve_transformer_predictor_calls_total")


# -- requests per minute, three replicas -------------------------------------------------------------

def test_three_replicas_admit_one_rpm_limit_within_5_percent(replicas: Replicas) -> None:
    limit = LIMITS["rpm"]["requests_per_minute"]
    prompt = chat_prompt(f"Say yes. {uuid.uuid4().hex[:6]}")
    first = v2(replicas.ts[0], "rpm", prompt)  # the miss; the rest are exact hits
    assert first.status_code == 200, first.text
    started = time.monotonic()  # the bucket is full again (0.6 s after the miss's request)
    clients = [httpx.Client() for _ in range(3)]
    statuses: list[int] = []

    def send(i: int) -> int:
        return v2(replicas.ts[i % 3], "rpm", prompt, clients[i % 3]).status_code

    with ThreadPoolExecutor(9) as pool:
        statuses = list(pool.map(send, range(2 * limit)))
    elapsed = time.monotonic() - started
    for c in clients:
        c.close()
    assert set(statuses) <= {200, 429}, statuses
    admitted = statuses.count(200)
    # A bucket of `limit` that refills limit/60 per second: what the limit allows over the burst.
    allowed = limit + limit / 60 * elapsed
    assert abs(admitted - allowed) <= 0.05 * limit, (admitted, allowed, elapsed)
    assert admitted >= limit - 1 and statuses.count(429) >= limit // 2
    refused = sum(metric_value(metrics_of(t), "semserve_tenant_refused_total", tenant="rpm",
                               reason="requests_per_minute") for t in replicas.ts)
    assert refused == statuses.count(429)


def test_the_openai_client_retries_a_429_after_retry_after(replicas: Replicas) -> None:
    t = replicas.ts[1]
    text = f"Say no. {uuid.uuid4().hex[:6]}"
    seen: list[tuple[int, str | None]] = []
    http_client = httpx.Client(event_hooks={"response": [
        lambda r: seen.append((r.status_code, r.headers.get("retry-after")))]})
    client = openai.OpenAI(base_url=t.openai_base, api_key=key("retry"), max_retries=3,
                           http_client=http_client)
    try:
        for _ in range(3):  # a bucket refilled between the drain and the call: drain again
            while chat(t, "retry", text, max_tokens=2).status_code == 200:
                pass
            seen.clear()
            reply = client.chat.completions.create(
                model="llm", messages=[{"role": "user", "content": text}], max_tokens=2, temperature=0)
            if seen[0][0] == 429:
                break
        assert seen[0][0] == 429 and seen[-1][0] == 200, seen
        # 20 per minute: one request back every 3 s at most.
        assert seen[0][1] is not None and 1 <= int(seen[0][1]) <= 3, seen
        assert reply.choices[0].message.content is not None
    finally:
        http_client.close()


# -- tokens per minute and concurrency ---------------------------------------------------------------

def test_tokens_reserved_before_the_predictor_settled_to_usage_hits_free(replicas: Replicas) -> None:
    t = replicas.ts[0]
    limit = LIMITS["tok"]["tokens_per_minute"]
    text = f"Name a colour. {uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    first = chat(t, "tok", text, max_tokens=16)
    assert first.status_code == 200, first.text
    used = first.json()["usage"]["prompt_tokens"] + first.json()["usage"]["completion_tokens"]
    assert used > 20  # the chat template's tokens count too
    assert "x-ratelimit-limit-requests" not in first.headers  # no such limit: no such headers
    assert first.headers["x-ratelimit-limit-tokens"] == str(limit)
    time.sleep(0.3)  # the settle is sent in the background
    calls = predictor_calls(t)
    # It reserves more than is left (its prompt estimate + 40), so it waits for the refill.
    refused = chat(t, "tok", f"Name a fruit. {uuid.uuid4().hex[:6]}", max_tokens=40)
    assert refused.status_code == 429, refused.text
    assert predictor_calls(t) == calls  # refused before any work
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "tokens_per_minute" in error["message"]
    assert "'tok'" in error["message"]
    assert int(refused.headers["retry-after"]) in range(1, 61)
    # Settled to the real usage (not to the reservation): what is left is the limit less the first
    # generation's tokens, plus the refill (1 token a second) since it was admitted.
    left = int(refused.headers["x-ratelimit-remaining-tokens"])
    assert limit - used <= left <= limit - used + 1 + (time.monotonic() - began), (left, used)
    # A hit spends no tokens (and is answered while the tokens are used up).
    hit = chat(t, "tok", text, max_tokens=16)
    assert hit.status_code == 200 and hit.headers["x-semserve-cache"] == "exact"
    assert int(hit.headers["x-ratelimit-remaining-tokens"]) >= left
    metrics = metrics_of(t)
    assert metric_value(metrics, "semserve_tenant_tokens_used_total", tenant="tok") == used
    assert metric_value(metrics, "semserve_tenant_tokens_admitted_total", tenant="tok") >= 16
    assert metric_value(metrics, "semserve_tenant_refused_total", tenant="tok",
                        reason="tokens_per_minute") == 1


def test_max_concurrent_holds_across_replicas_and_frees_on_cancel(replicas: Replicas) -> None:
    a, b = replicas.ts[0], replicas.ts[1]
    body = {"model": "llm", "max_tokens": 400, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": f"Count to 500. {uuid.uuid4().hex[:6]}"}]}
    headers = {"authorization": f"Bearer {key('conc')}"}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{a.openai_base}/chat/completions", json=body, headers=headers) as s:
            assert s.status_code == 200
            lines = s.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # the generation runs at the predictor
            other = chat(b, "conc", f"Say hi. {uuid.uuid4().hex[:6]}", max_tokens=1)
            assert other.status_code == 429, other.text
            assert "max_concurrent" in other.json()["error"]["message"]
            assert other.headers["retry-after"] == "1"
            del lines
        # The client left: the generation is cancelled and its ticket freed.
        deadline = time.monotonic() + 15
        while (r := chat(b, "conc", f"Say ok. {uuid.uuid4().hex[:6]}", max_tokens=1)).status_code == 429:
            assert time.monotonic() < deadline, "the cancelled stream's ticket was never freed"
            time.sleep(0.3)
        assert r.status_code == 200, r.text


# -- the default entry, and how each protocol refuses ------------------------------------------------

def test_the_default_entry_refuses_on_every_protocol(replicas: Replicas) -> None:
    t = replicas.ts[2]
    prompt = chat_prompt(f"Say a. {uuid.uuid4().hex[:6]}")
    assert [v2(t, "anon", prompt).status_code for _ in range(3)] == [200, 200, 200]
    rest = v2(t, "anon", prompt)
    assert rest.status_code == 429
    text = rest.json()["error"]
    assert text.startswith("tenant 'anon' is over its requests_per_minute limit (3 requests per minute)")
    assert int(rest.headers["retry-after"]) in range(1, 21)

    # OpenAI: chat and completions, streamed or not: a 429 JSON with the headers, never a stream.
    for route in ("chat/completions", "completions"):
        for stream in (False, True):
            r = chat(t, "anon", "Say b.", stream=stream, route=route)
            assert r.status_code == 429 and r.headers["content-type"] == "application/json", r.text
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "rate_limit_exceeded" and error["message"].startswith(text[:60])
            assert r.headers["x-ratelimit-limit-requests"] == "3"
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
            assert RESET.match(r.headers["x-ratelimit-reset-requests"])
            assert "x-ratelimit-limit-tokens" not in r.headers
            assert int(r.headers["retry-after"]) >= 1

    # gRPC: ModelInfer is RESOURCE_EXHAUSTED; ModelStreamInfer answers the request in its stream
    # with the same text and the 429 status parameter (the stream itself stays open).
    def request() -> pb.ModelInferRequest:
        req = pb.ModelInferRequest(model_name="llm", id="q")
        inp = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        inp.contents.bytes_contents.append(prompt.encode())
        req.parameters["max_tokens"].int64_param = 1
        return req

    async def grpc_calls() -> tuple[grpc.aio.AioRpcError, oip.ModelStreamInferResponse]:
        md = (("x-api-key", key("anon")),)
        async with grpc.aio.insecure_channel(t.grpc) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(request(), metadata=md, timeout=30)
            streamed = request()
            streamed.inputs.add(name="stream", datatype="BOOL", shape=[1]).contents.bool_contents.append(True)

            async def one() -> Any:
                yield streamed

            # Triton's bidirectional RPC (KServe's proto lacks it): the wire formats are the same.
            rpc = ch.stream_stream(MODEL_STREAM_INFER,
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=oip.ModelStreamInferResponse.FromString)
            replies = [r async for r in rpc(one(), metadata=md, timeout=30)]
        return err.value, replies[0]

    unary, streamed_reply = asyncio.run(grpc_calls())
    assert unary.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert unary.details().startswith(text[:60])
    assert streamed_reply.error_message.startswith(text[:60])
    assert streamed_reply.infer_response.parameters["semserve_error_status"].int64_param == 429


def test_headers_on_every_openai_answer_and_none_without_limits(replicas: Replicas) -> None:
    t = replicas.ts[1]
    text = f"Say c. {uuid.uuid4().hex[:6]}"
    for route in ("chat/completions", "completions"):
        for stream in (False, True):
            r = chat(t, "both", text, max_tokens=2, stream=stream, route=route)
            assert r.status_code == 200, r.text
            for name in ("requests", "tokens"):
                assert RESET.match(r.headers[f"x-ratelimit-reset-{name}"]), r.headers
            assert r.headers["x-ratelimit-limit-requests"] == "50"
            assert r.headers["x-ratelimit-limit-tokens"] == "5000"
            # One taken per call (the bucket refills 50/60 per second meanwhile).
            assert 0 <= int(r.headers["x-ratelimit-remaining-requests"]) < 50
            assert 0 < int(r.headers["x-ratelimit-remaining-tokens"]) <= 5000
    free = chat(t, "free", text, max_tokens=2)
    assert free.status_code == 200 and not any(h.startswith("x-ratelimit") for h in free.headers)


# -- a bad limits file ------------------------------------------------------------------------------

def test_a_bad_limits_file_stops_the_transformer_naming_tenant_and_field(
    predictor: Predictor, tmp_path: Path
) -> None:
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"acme": {"tokens_per_minute": -5}}))
    log = LOG_DIR / f"transformer-badlimits-{uuid.uuid4().hex[:6]}.log"
    proc = ServerProcess(["transformer", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
                          "--predictor-host", predictor.grpc, "--cache-policy", "off"],
                         log, env={"SEMSERVE_TRANSFORMER_TENANT_LIMITS_FILE": str(path)}).start()
    assert proc.proc is not None
    code = proc.proc.wait(120)
    assert code != 0
    errors = [json.loads(line) for line in log.read_text().splitlines()
              if line.startswith("{") and '"level": "error"' in line]
    assert len(errors) == 1, errors
    assert errors[0]["event"] == "tenant_limits_invalid"
    assert "tenant 'acme': field 'tokens_per_minute' must not be negative" in errors[0]["error"]


# -- Redis down: limits fail open (last: it kills the module's Redis) --------------------------------

def test_redis_killed_mid_run_limits_fail_open(replicas: Replicas) -> None:
    t = replicas.ts[2]
    prompt = chat_prompt(f"Say d. {uuid.uuid4().hex[:6]}")
    statuses: list[int] = []
    stop = threading.Event()

    def flow() -> None:
        with httpx.Client() as client:
            while not stop.is_set():
                statuses.append(v2(t, "flow", prompt, client).status_code)

    sender = threading.Thread(target=flow)
    sender.start()
    try:
        deadline = time.monotonic() + 60
        while len(statuses) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        replicas.redis.stop()
        before = len(statuses)
        while len(statuses) < before + 8:
            assert time.monotonic() < deadline, statuses
            time.sleep(0.05)
    finally:
        stop.set()
        sender.join(120)
    assert set(statuses) == {200}, statuses  # requests kept flowing
    assert metric_value(metrics_of(t), "semserve_tenant_limits_fail_open_total") >= 8
    log = t.process.log_path.read_text()
    assert log.count('"event": "tenant_limits_fail_open"') == 1
