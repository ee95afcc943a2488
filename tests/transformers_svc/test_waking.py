"""Misses held while the predictor is not ready (--predictor-hold-s; transformers_svc/held_misses.py).

The bookkeeping alone here: the per-tenant cap and its 503 with Retry-After, the one readiness wait
the held misses share, the start time measured. Holding through a real predictor process that is
started only after the requests arrived (SSE comments to the waiting OpenAI stream, nothing false on
the v2 stream, the cap, hits answered) is checked in
tests/transformers_svc/test_faults_kill.py's restart, by `held_while_down` below.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from semserve.errors import Overloaded, Unavailable, retry_after
from tests.support import metric_value
from transformers_svc.held_misses import HeldMisses


class Readiness:
    """The predictor's answer to "are you ready?", as the test sets it; counts the questions."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.asked = 0

    async def __call__(self, within_s: float) -> bool:
        self.asked += 1
        try:
            await asyncio.wait_for(self.ready.wait(), min(within_s, 0.05))
        except TimeoutError:
            return False
        return True


def test_cap_per_tenant_refuses_with_the_start_time_left_and_the_wait_is_shared() -> None:
    async def run() -> None:
        readiness = Readiness()
        held = HeldMisses(f"m-{uuid.uuid4().hex[:6]}", cap_per_tenant=2, start_estimate_s=60.0,
                          probe=readiness, poll_s=0.01)
        waits = [asyncio.ensure_future(held.wait_ready("a", 30)) for _ in range(2)]
        other = asyncio.ensure_future(held.wait_ready("b", 30))  # another tenant has its own cap
        await asyncio.sleep(0.2)
        assert held.held == {"a": 2, "b": 1}
        with pytest.raises(Overloaded) as refused:
            await held.wait_ready("a", 30)
        # The start time left: the wake began ~0.2 s ago and is expected to take 60 s.
        assert 55 < refused.value.retry_after_s < 60
        assert 55 < retry_after(refused.value) <= 60
        assert "predictor is starting" in refused.value.message
        asked = readiness.asked
        await asyncio.sleep(0.2)
        # One question at a time for all three held misses (not one per miss).
        assert readiness.asked - asked <= 6
        readiness.ready.set()
        await asyncio.gather(*waits, other)
        assert held.held == {}
        assert held.waking_since is None
        # Woken in ~0.4 s: a reconnect, not a start; the estimate stays.
        assert held.start_estimate_s == 60.0
        assert held.retry_after_s() == 60.0

    asyncio.run(run())


def test_held_miss_gives_up_after_its_bound_and_a_measured_start_replaces_the_estimate() -> None:
    async def run() -> None:
        readiness = Readiness()
        held = HeldMisses(f"m-{uuid.uuid4().hex[:6]}", cap_per_tenant=4, start_estimate_s=60.0,
                          probe=readiness, poll_s=0.01)
        started = time.monotonic()
        with pytest.raises(Unavailable) as late:
            await held.wait_ready("a", 0.3)
        assert not isinstance(late.value, Overloaded)
        assert "not ready after 0.3 s" in late.value.message
        assert 0.3 <= time.monotonic() - started < 2
        assert held.held == {}
        # Nobody waits: the wake ends, unready, once its probe in flight (up to 0.05 s) returns.
        for _ in range(200):  # up to 2 s
            if held.waking_since is None:
                break
            await asyncio.sleep(0.01)
        assert held.waking_since is None
        # A wake that takes over a second is a start: it becomes the estimate.
        waiting = asyncio.ensure_future(held.wait_ready("a", 30))
        await asyncio.sleep(1.2)
        readiness.ready.set()
        await waiting
        assert held.start_estimate_s >= 1.2 and held.start_estimate_s < 5

    asyncio.run(run())


# -- through a real predictor restart (called by test_faults_kill.py) ------------------------------

HOLD_FLAGS = ("--predictor-hold-s", "600", "--sse-keepalive-s", "2", "--held-misses-per-tenant", "3")


@dataclass
class Waking:
    """What clients of a holding transformer saw while its predictor was down, then started."""

    ready_at: float = 0.0  # when the restarted predictor's readiness probe first passed
    sse_lines: list[tuple[float, str]] = field(default_factory=list)  # raw OpenAI stream: (time, line)
    sse_status: int = 0
    openai_text: str = ""
    openai_finish: str | None = None
    v2_lines: list[tuple[float, str]] = field(default_factory=list)
    v2_status: int = 0
    refused: list[tuple[int, str | None, str]] = field(default_factory=list)  # status, Retry-After, body
    hit: tuple[int, str] = (0, "")
    held_gauge: float = 0.0
    after: dict[str, Any] = field(default_factory=dict)


def _chat(prompt: str, stream: bool) -> dict[str, Any]:
    return {"model": "llm", "temperature": 0, "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": prompt}]}


async def held_while_down(http: str, predictor_http: str, stored: str) -> Waking:
    """With the predictor process dead (not yet started again): three streamed misses held (a raw
    SSE read, the openai client, a v2 generate_stream), two more refused past the cap, a hit
    answered; then, once the predictor is started and ready, the held ones answered."""
    seen = Waking()
    tag = uuid.uuid4().hex[:6]
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10)) as client:

        async def raw_sse() -> None:
            body = _chat(f"Describe a mountain ({tag}).", True)
            async with client.stream("POST", f"{http}/openai/v1/chat/completions", json=body) as r:
                seen.sse_status = r.status_code
                async for line in r.aiter_lines():
                    if line:
                        seen.sse_lines.append((time.monotonic(), line))

        async def openai_stream() -> None:
            oa = AsyncOpenAI(base_url=f"{http}/openai/v1", api_key="unused", timeout=900, max_retries=0)
            stream = await oa.chat.completions.create(**_chat(f"Describe a lake ({tag}).", True))
            async for chunk in stream:
                for choice in chunk.choices:
                    seen.openai_text += choice.delta.content or ""
                    seen.openai_finish = choice.finish_reason or seen.openai_finish
            await oa.close()

        async def v2_stream() -> None:
            # ignore_eos: eight pieces of text whatever the model makes of the prompt.
            body = {"text_input": f"Describe a desert ({tag}).",
                    "parameters": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}}
            async with client.stream("POST", f"{http}/v2/models/llm/generate_stream", json=body) as r:
                seen.v2_status = r.status_code
                async for line in r.aiter_lines():
                    if line:
                        seen.v2_lines.append((time.monotonic(), line))

        async def held_now() -> float:
            return metric_value((await client.get(f"{http}/metrics")).text, "semserve_held_misses",
                                tenant="default")

        async def until_ready() -> None:
            while True:
                try:
                    if (await client.get(f"{predictor_http}/v2/health/ready", timeout=5)).status_code == 200:
                        seen.ready_at = time.monotonic()
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.5)

        held = [asyncio.ensure_future(f()) for f in (raw_sse, openai_stream, v2_stream)]
        deadline = time.monotonic() + 30
        seen.held_gauge = await held_now()
        while seen.held_gauge < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            seen.held_gauge = await held_now()
        # Past the cap: a v2 miss and an OpenAI miss refused at once, with Retry-After.
        r = await client.post(f"{http}/v2/models/llm/infer", json={
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                        "data": [f"Describe a forest ({tag})."]}],
            "parameters": {"max_tokens": 8, "temperature": 0}})
        seen.refused.append((r.status_code, r.headers.get("retry-after"), r.text[:300]))
        r = await client.post(f"{http}/openai/v1/chat/completions",
                              json=_chat(f"Describe a sea ({tag}).", False))
        seen.refused.append((r.status_code, r.headers.get("retry-after"), r.text[:300]))
        # A hit is answered while misses are held.
        r = await client.post(f"{http}/v2/models/llm/infer", json={
            "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [stored]}],
            "parameters": {"max_tokens": 8, "temperature": 0}})
        status = next((o["data"][0] for o in r.json().get("outputs", []) if o["name"] == "cache_status"), "")
        seen.hit = (r.status_code, str(status))
        await until_ready()
        await asyncio.wait_for(asyncio.gather(*held), 300)
        text = (await client.get(f"{http}/metrics")).text
        seen.after = {
            "held": metric_value(text, "semserve_held_misses", tenant="default"),
            "refused": metric_value(text, "semserve_held_misses_refused_total", tenant="default"),
            "start_estimate_s": metric_value(text, "semserve_predictor_start_estimate_seconds"),
        }
    return seen


def check_waking(seen: Waking, down_since: float) -> None:
    """What `held_while_down` saw is what holding promises."""
    assert seen.held_gauge == 3, seen
    # Refused past the cap: 503 with the start time left as Retry-After.
    for status, retry, body in seen.refused:
        assert status == 503 and retry is not None and 1 <= int(retry) <= 66, (status, retry, body)
        assert "predictor is starting" in body, body
    assert seen.hit == (200, "exact"), seen.hit
    # The raw OpenAI stream: comments while the predictor was down, then the answer, no error.
    assert seen.sse_status == 200
    comments = [t for t, line in seen.sse_lines if line.startswith(":")]
    data = [(t, line) for t, line in seen.sse_lines if line.startswith("data: ")]
    assert len(comments) >= 5, seen.sse_lines[:10]
    assert all(t < data[0][0] for t in comments), "a comment after the first chunk"
    assert data[-1][1] == "data: [DONE]", data[-3:]
    chunks = [json.loads(line[6:]) for _, line in data[:-1]]
    assert not any("error" in c for c in chunks), chunks
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).strip()
    # The openai client ignored the comments and got a whole answer.
    assert seen.openai_text.strip() and seen.openai_finish in ("stop", "length"), seen
    # The v2 stream: nothing (no comment, no piece) before the predictor was ready, then the answer.
    assert seen.v2_status == 200
    assert seen.v2_lines and all(line.startswith("data: ") for _, line in seen.v2_lines), seen.v2_lines
    assert seen.v2_lines[0][0] > seen.ready_at - 1.0, (seen.v2_lines[0][0] - seen.ready_at)
    events = [json.loads(line[6:]) for _, line in seen.v2_lines]
    assert "".join(e["text_output"] for e in events).strip(), events
    assert events[-1]["finish_reason"] == "length", events
    assert {e["cache_status"] for e in events} == {"miss"}, events
    # Held no more; the refusals counted; the start measured (first held miss to ready).
    assert seen.after["held"] == 0 and seen.after["refused"] == 2, seen.after
    assert 10 < seen.after["start_estimate_s"] < seen.ready_at - down_since + 5, seen.after
