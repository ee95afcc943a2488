"""Concurrency and cancellation against the real engine."""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
from kserve import InferenceGRPCClient, InferInput, InferRequest

from tests.conftest import FRANCE, Predictor
from tests.support import metric_value

ABORTED = "semserve_predictor_requests_aborted_total"
IN_FLIGHT = "semserve_predictor_requests_in_flight"


async def test_32_concurrent_requests_across_protocols_all_succeed(predictor: Predictor) -> None:
    async with httpx.AsyncClient(timeout=300) as client:

        async def v2(i: int) -> str:
            r = await client.post(
                f"{predictor.http}/v2/models/llm/infer",
                json={
                    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                "data": [f"Item {i}: the"]}],
                    "parameters": {"max_tokens": 16, "temperature": 0},
                },
            )
            assert r.status_code == 200, r.text
            return r.json()["outputs"][0]["data"][0]

        async def chat(i: int) -> str:
            r = await client.post(
                f"{predictor.openai_base}/chat/completions",
                json={"model": "llm", "max_tokens": 16, "temperature": 0,
                      "messages": [{"role": "user", "content": f"Say {i}"}]},
            )
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

        started = time.monotonic()
        results = await asyncio.gather(*(v2(i) if i % 2 else chat(i) for i in range(32)))
        elapsed = time.monotonic() - started
    assert len(results) == 32 and all(isinstance(r, str) for r in results)
    # Not a timing target: a sanity check that requests were batched, not run one by one
    # (32 x 16 tokens one at a time would take far longer on this engine).
    assert elapsed < 240


async def _metric(predictor: Predictor, name: str, **labels: str) -> float:
    async with httpx.AsyncClient() as client:
        return metric_value((await client.get(f"{predictor.http}/metrics")).text, name, **labels)


async def _wait_metric(predictor: Predictor, name: str, pred, timeout_s: float = 30, **labels) -> float:
    deadline = time.monotonic() + timeout_s
    value = 0.0
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            value = metric_value((await client.get(f"{predictor.http}/metrics")).text, name, **labels)
            if pred(value):
                return value
            await asyncio.sleep(0.2)
    return value


def _long_body(stream: bool) -> dict:
    return {"model": "llm", "prompt": "Write a very long story about dragons.", "max_tokens": 1500,
            "temperature": 0, "ignore_eos": True, "stream": stream}


async def test_disconnect_mid_stream_aborts_the_engine_request(predictor: Predictor) -> None:
    before = await _metric(predictor, ABORTED, protocol="openai")
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{predictor.openai_base}/completions",
                                 json=_long_body(True)) as resp:
            got = 0
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    got += 1
                if got >= 3:
                    break
    after = await _wait_metric(predictor, ABORTED, lambda v: v > before, protocol="openai")
    assert after == before + 1
    assert await _wait_metric(predictor, IN_FLIGHT, lambda v: v == 0) == 0
    # The engine let go of it too, and vLLM's own gauge (what fair admission reads) says so: with
    # the engine core in this process, a batch emptied by an abort records no step of its own.
    assert await _wait_metric(predictor, "vllm:num_requests_running", lambda v: v == 0) == 0


async def test_disconnect_on_non_streaming_request_aborts(predictor: Predictor) -> None:
    before = await _metric(predictor, ABORTED, protocol="v2-rest")
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["Tell a long tale"]}],
        "parameters": {"max_tokens": 1500, "ignore_eos": True},
    }
    async with httpx.AsyncClient(timeout=1.5) as client:
        try:
            await client.post(f"{predictor.http}/v2/models/llm/infer", json=body)
            raise AssertionError("1500 tokens should not finish within 1.5 s")
        except httpx.ReadTimeout:
            pass
    after = await _wait_metric(predictor, ABORTED, lambda v: v > before, protocol="v2-rest")
    assert after == before + 1


async def test_grpc_deadline_aborts_the_engine_request(predictor: Predictor) -> None:
    before = await _metric(predictor, ABORTED, protocol="v2-grpc")
    client = InferenceGRPCClient(predictor.grpc, timeout=1, retries=0)
    request = InferRequest(
        "llm", [InferInput("text_input", [1], "BYTES", [FRANCE])],
        parameters={"max_tokens": 1500, "ignore_eos": True},
    )
    try:
        await client.infer(request)
        raise AssertionError("1500 tokens should not finish within 1 s")
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await client.close()
    after = await _wait_metric(predictor, ABORTED, lambda v: v > before, protocol="v2-grpc")
    assert after == before + 1


async def test_metrics_filtered_by_name_as_prometheus_exposition_does(predictor: Predictor) -> None:
    """Fair admission reads three of the predictor's gauges several times a second: `name[]` gives
    those alone (semserve/serving/metrics_filter.py), the URL the transformer reads."""
    from transformers_svc.saturation import filtered, parse_load

    async with httpx.AsyncClient() as client:
        whole = (await client.get(f"{predictor.http}/metrics")).text
        resp = await client.get(filtered(f"{predictor.http}/metrics"))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in resp.text.splitlines()
             if line and not line.startswith("#")}
    assert names == {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
    assert len(resp.text) * 20 < len(whole)  # the whole page is ~56 kB
    assert parse_load(resp.text) is not None
