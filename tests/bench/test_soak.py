"""The soak: its answer check on its own (pure, on made-up records), then a one-minute
`semserve bench soak` in process against the session predictor and a transformer with three
tenants' keys, mixed load on every protocol: zero errors, every answer the predictor's own, no RSS
or fd growth."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from bench.soak import Endpoint, soak, summary
from bench.soak_verify import Generation, Sent, Served, read_generations, verify
from tests.conftest import Predictor, start_transformer
from transformers_svc.auth import hash_key


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sent(rid: str, prompt: str = "p", tenant: str = "a", accept: tuple[str, ...] = ()) -> Sent:
    return Sent(rid, "v2-rest", "exact", tenant, "raw", prompt, accept or (prompt,))


def gen(rid: str, text: str, outcome: str = "ok", finish: str = "stop", tokens: int = 3) -> Generation:
    return Generation(rid, outcome, finish, tokens, sha(text))


def test_verify_accepts_the_predictors_own_answers() -> None:
    s1, s2, s3 = sent("r1"), sent("r2"), sent("r3", prompt="q", accept=("q", "p"))
    gens = {"r1": [gen("r1", "Paris.")]}
    v = verify([(s1, Served("miss", "Paris.", "stop", 3)), (s2, Served("exact", "Paris.", "stop", 3)),
                (s3, Served("semantic", "Paris.", "stop", 3))], [s1, s2, s3], gens)
    assert not v.failures, v.samples
    assert (v.misses_by_request, v.hits) == (1, 2)


def test_verify_catches_a_cut_or_changed_miss() -> None:
    s1 = sent("r1")
    gens = {"r1": [gen("r1", "The capital is Paris.", finish="length", tokens=8)]}
    # One token short: a cut answer (text differs from the generation's digest).
    v = verify([(s1, Served("miss", "The capital is", "length", 8))], [s1], gens)
    assert v.failures == {"wrong_answer": 1}
    # Same text, fewer tokens claimed.
    v = verify([(s1, Served("miss", "The capital is Paris.", "length", 7))], [s1], gens)
    assert v.failures == {"partial_answer": 1}
    # The generation itself was aborted: whatever was served is partial.
    aborted = {"r1": [gen("r1", "The", outcome="aborted", finish="")]}
    v = verify([(s1, Served("miss", "The", "stop", 1))], [s1], aborted)
    assert v.failures == {"partial_answer": 1}
    # The response itself says it did not end cleanly.
    v = verify([(s1, Served("miss", "The capital is Paris.", "abort", 8))], [s1], gens)
    assert v.failures == {"partial_answer": 1}


def test_verify_catches_a_hit_the_predictor_never_gave_that_tenant() -> None:
    s1, s2 = sent("r1", tenant="a"), sent("r2", tenant="b")
    gens = {"r1": [gen("r1", "Paris.")]}
    v = verify([(s1, Served("miss", "Paris.", "stop", 3)), (s2, Served("exact", "Paris.", "stop", 3))],
               [s1, s2], gens)
    assert v.failures == {"wrong_answer": 1}  # tenant b never had this prompt generated
    s3 = sent("r3", prompt="other")
    v = verify([(s3, Served("semantic", "Paris.", "stop", 3))], [s1, s3], gens)
    assert v.failures == {"wrong_answer": 1}  # "other" does not paraphrase "p"


def test_verify_joined_misses_need_a_generation_of_that_prompt() -> None:
    s1, s2 = sent("r1"), sent("r2")
    gens = {"r1": [gen("r1", "Paris.")]}
    ok = verify([(s2, Served("miss", "Paris.", "stop", 3))], [s1, s2], gens)
    assert not ok.failures and ok.misses_joined == 1
    bad = verify([(s2, Served("miss", "Lyon.", "stop", 3))], [s1, s2], gens)
    assert bad.failures == {"wrong_answer": 1}


def test_read_generations_files_v2_prompts_under_the_request(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    lines = [
        {"event": "generation_finished", "request_id": "soak-x-1-0", "outcome": "ok", "finish_reason": "stop",
         "completion_tokens": 2, "output_sha256": "aa"},
        {"event": "generation_finished", "request_id": "soak-x-2", "outcome": "aborted",
         "finish_reason": None, "completion_tokens": 0, "output_sha256": "bb"},
        {"event": "generation_finished", "request_id": "other-3", "outcome": "ok"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json generation_finished soak-x\n")
    got = read_generations(log, "soak-x")
    assert sorted(got) == ["soak-x-1", "soak-x-2"]
    assert got["soak-x-2"][0].outcome == "aborted"


def test_soak_60s(predictor: Predictor, redis_url: str, tmp_path: Path) -> None:
    keys = {f"tenant{i}": f"soak-test-key-{i}" for i in range(3)}
    (tmp_path / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
    t = start_transformer("soak", predictor.grpc, redis_url,
                          "--api-keys-file", str(tmp_path / "keys.json"))
    try:
        assert t.process.proc is not None and predictor.process.proc is not None
        pids = {"transformer": t.process.proc.pid, "predictor": predictor.process.proc.pid}
        report = asyncio.run(soak(
            Endpoint(t.http, t.grpc), duration_s=60, concurrency=8,
            predictor_log=predictor.process.log_path, keys=keys, pids=pids,
        ))
        print(summary(report))
        assert not report.errors, report.error_samples
        assert report.requests >= 50
        # Every op and every path was exercised, and the cache served hits.
        assert {op.split(":")[0] for op in report.statuses} == {"exact", "paraphrase", "miss"}
        assert len(report.latencies) == 6
        assert any(s.endswith(":exact") for s in report.statuses)
        # Every answer was checked, and misses against their own request's generation.
        assert report.verdict.checked == report.requests
        assert report.verdict.misses_by_request > 0
        assert report.passed, report.failures
        assert t.process.proc.poll() is None
    finally:
        t.process.stop()
