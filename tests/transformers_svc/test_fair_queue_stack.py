"""Fair admission end to end (issue 27 item 5): the shared real predictor, a real transformer process
reading the predictor's own /metrics, two API keys, real httpx clients.

The transformer is told the predictor has room only while it is idle (--fair-max-kv-cache-usage 0:
any running request uses KV cache; --fair-max-waiting 1), so misses go one at a time and the order
in which they are admitted is the order in which they finish. A noisy tenant backlogs five long
misses; a quiet tenant's one short miss, sent after them, is admitted after at most two of them
(first-come-first-served would put it after all five).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx

from tests.conftest import Predictor, start_transformer
from tests.support import metric_value
from transformers_svc.auth import hash_key

NOISY, QUIET = 5, "quiet"


def test_quiet_tenant_is_admitted_ahead_of_a_backlogged_noisy_tenant(
    predictor: Predictor, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "keys.json").write_text(json.dumps({t: [hash_key(f"key-{t}")] for t in ("quiet", "noisy")}))
    t = start_transformer(
        f"fair-{uuid.uuid4().hex[:6]}", predictor.grpc, redis_url,
        "--api-keys-file", str(tmp_path / "keys.json"),
        "--predictor-metrics-url", f"{predictor.http}/metrics",
        "--fair-max-waiting", "1", "--fair-max-kv-cache-usage", "0", "--fair-poll-s", "0.05",
        "--fair-max-wait-s", "600",
    )
    run = uuid.uuid4().hex[:8]

    async def chat(client: httpx.AsyncClient, tenant: str, i: int, max_tokens: int) -> float:
        body = {"model": "llm", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Tell a story about river {i} ({run})."}]}
        resp = await client.post(f"{t.openai_base}/chat/completions", json=body,
                                 headers={"authorization": f"Bearer key-{tenant}"})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-semserve-cache"] == "miss"
        return time.monotonic()

    async def scenario() -> tuple[list[float], float]:
        async with httpx.AsyncClient(timeout=120) as client:
            noisy = [asyncio.create_task(chat(client, "noisy", i, 40)) for i in range(NOISY)]
            await asyncio.sleep(0.5)  # the noisy tenant is backlogged: one runs, four wait
            quiet = await chat(client, QUIET, 99, 4)
            return sorted(await asyncio.gather(*noisy)), quiet

    try:
        noisy_done, quiet_done = asyncio.run(scenario())
        before_quiet = sum(1 for d in noisy_done if d < quiet_done)
        # Admitted one at a time: the running one, perhaps one more admitted with it, then quiet.
        assert before_quiet <= 2, f"{before_quiet} of {NOISY} noisy misses finished before the quiet one"
        text = httpx.get(f"{t.http}/metrics", timeout=10).text
        waited = metric_value(text, "semserve_admission_queue_seconds_sum", tenant="noisy")
        assert metric_value(text, "semserve_admission_queue_seconds_count", tenant="noisy") == NOISY
        assert metric_value(text, "semserve_admission_queue_seconds_count", tenant="quiet") == 1
        assert waited > 1.0  # the noisy misses really queued
        assert metric_value(text, "semserve_admission_queue_depth") == 0
    finally:
        t.process.stop()
