"""SIGTERM with requests in flight: they finish, new ones get 503, the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from tests.conftest import Predictor
from tests.support import metric_value


@pytest.mark.stops_predictor
async def test_sigterm_drains_in_flight_requests(predictor: Predictor) -> None:
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["A story:"]}],
        "parameters": {"max_tokens": 120, "ignore_eos": True, "temperature": 0},
    }
    async with httpx.AsyncClient(timeout=120) as client:
        calls = [
            asyncio.ensure_future(client.post(f"{predictor.http}/v2/models/llm/infer", json=body))
            for _ in range(4)
        ]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = (await client.get(f"{predictor.http}/metrics")).text
            if metric_value(text, "semserve_predictor_requests_in_flight") >= 4:
                break
            await asyncio.sleep(0.05)
        predictor.process.signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        refused = await client.post(f"{predictor.http}/v2/models/llm/infer", json=body)
        ready = await client.get(f"{predictor.http}/v2/health/ready")
        responses = await asyncio.gather(*calls)
    assert refused.status_code == 503
    assert ready.status_code == 503
    for r in responses:
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][2]["data"] == [120]  # every in-flight answer is whole
    assert predictor.process.proc is not None
    assert predictor.process.proc.wait(60) == 0
