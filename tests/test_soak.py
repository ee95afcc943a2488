"""A one-minute `semserve bench soak` in process: the session predictor, a transformer with three
tenants' keys, mixed load on every protocol; zero errors, every answer right, no RSS or fd growth."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bench.soak import Endpoint, soak, summary
from tests.conftest import Predictor, start_transformer
from transformers_svc.auth import hash_key


def test_soak_60s(predictor: Predictor, redis_url: str, tmp_path: Path) -> None:
    keys = {f"tenant{i}": f"soak-test-key-{i}" for i in range(3)}
    (tmp_path / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
    t = start_transformer("soak", predictor.grpc, predictor.http, redis_url,
                          "--api-keys-file", str(tmp_path / "keys.json"))
    try:
        assert t.process.proc is not None and predictor.process.proc is not None
        pids = {"transformer": t.process.proc.pid, "predictor": predictor.process.proc.pid}
        report = asyncio.run(soak(
            Endpoint(t.http, t.grpc), Endpoint(predictor.http, predictor.grpc),
            duration_s=60, concurrency=8, keys=keys, pids=pids,
        ))
        print(summary(report))
        assert not report.errors, report.error_samples
        assert report.requests >= 50
        # Every op and every path was exercised, and the cache served hits.
        assert {op.split(":")[0] for op in report.statuses} == {"exact", "paraphrase", "miss"}
        assert len(report.latencies) == 6
        assert any(s.endswith(":exact") for s in report.statuses)
        assert report.passed, report.failures
        assert t.process.proc.poll() is None
    finally:
        t.process.stop()
