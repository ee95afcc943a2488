"""The request log (--request-log): opt-in JSON lines with a prompt hash (the prompt itself only
with --record-prompt-text), rotated by size, and never the prompt text in the service's own logs."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import LOG_DIR, Predictor, Transformer, start_transformer
from transformers_svc.request_log import RequestLog, prompt_hash

FIELDS = {"ts", "request_id", "tenant", "route", "protocol", "status", "cache", "latency_ms", "prompt_sha256"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_rotation_and_no_propagation(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = RequestLog(tmp_path / "requests.jsonl", full=True, max_bytes=2000, backups=2)
    import time

    for i in range(60):
        log.record(route="/x", protocol="v2-rest", status=200, cache=["miss"], started=time.monotonic(),
                   prompts=[f"secret prompt {i}"], request_id=str(i), answers=["a"])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["requests.jsonl", "requests.jsonl.1", "requests.jsonl.2"], files
    assert all(p.stat().st_size <= 2500 for p in tmp_path.iterdir())
    # Full records hold prompts: they go to the request log file only, never to the root logger.
    assert "secret prompt" not in caplog.text
    last = _lines(tmp_path / "requests.jsonl")[-1]
    assert last["request_id"] == "59" and last["request"]["prompts"] == ["secret prompt 59"]
    assert last["prompt_sha256"] == [hashlib.sha256(b"secret prompt 59").hexdigest()]
    assert RequestLog(None).enabled is False


@pytest.fixture(scope="module")
def logged(predictor: Predictor, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("request-log")
    t = start_transformer("request-log", predictor.grpc, redis_url,
                          "--request-log", str(d / "requests.jsonl"), "--log-level", "debug")
    yield t, d / "requests.jsonl", LOG_DIR / "transformer-request-log.log"
    t.process.stop()


def _traffic(t: Transformer, word: str) -> list[str]:
    """v2, completions, chat (plain and streamed), each twice (a miss, then a hit); returns the
    prompts sent."""
    p_v2 = f"Describe the {word} in one word."
    p_chat = f"Which colour is the {word}?"
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [p_v2]}],
            "parameters": {"max_tokens": 3, "temperature": 0}}
    chat = {"model": "llm", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": p_chat}]}
    for _ in range(2):
        rid = uuid.uuid4().hex
        r = httpx.post(f"{t.http}/v2/models/llm/infer", json=body, headers={"x-request-id": rid}, timeout=60)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{t.openai_base}/chat/completions", json=chat, timeout=60)
        assert r.status_code == 200, r.text
        with httpx.stream("POST", f"{t.openai_base}/chat/completions", json={**chat, "stream": True},
                          timeout=60) as s:
            s.read()
    r = httpx.post(f"{t.openai_base}/completions", json={"model": "other", "prompt": p_v2}, timeout=60)
    assert r.status_code == 404
    return [p_v2, p_chat]


def test_lines_carry_hashes_not_prompts(logged) -> None:
    t, log_path, _ = logged
    word = f"zebrafinch{uuid.uuid4().hex[:6]}"
    start = log_path.stat().st_size if log_path.exists() else 0
    prompts = _traffic(t, word)
    entries = [json.loads(line) for line in log_path.read_text()[start:].splitlines() if line.strip()]
    assert len(entries) == 7, entries
    for e in entries:
        assert FIELDS <= set(e) and "request" not in e and "response" not in e
        assert e["tenant"] == "default" and e["latency_ms"] >= 0
    text = log_path.read_text()
    assert word not in text  # hashes only
    v2_lines = [e for e in entries if e["protocol"] == "v2-rest"]
    assert [e["cache"] for e in v2_lines] == [["miss"], ["exact"]]
    assert v2_lines[0]["prompt_sha256"] == [prompt_hash(prompts[0])]
    assert v2_lines[0]["route"] == "/v2/models/llm/infer" and len(v2_lines[0]["request_id"]) == 32
    chat_lines = [e for e in entries if e["route"] == "/openai/v1/chat/completions"]
    assert [e["cache"] for e in chat_lines] == [["miss"], ["miss"], ["exact"], ["exact"]] or \
        sorted(c for e in chat_lines for c in e["cache"]).count("exact") >= 2, chat_lines
    assert all(e["prompt_sha256"] == [prompt_hash(prompts[1])] for e in chat_lines)
    errors = [e for e in entries if e["status"] == 404]
    assert len(errors) == 1 and errors[0]["route"] == "/openai/v1/completions"


def test_service_debug_log_has_no_prompt_text(logged) -> None:
    """At debug level the service log must not carry prompts. Known exception (reported, owned by
    cache/verify/rules.py and transformers_svc/answer_pipeline.py): the verifier's decision `detail`,
    which names the content words that differ between the prompt and a cached look-alike. This
    test fails on any other line that carries prompt words."""
    t, _, service_log = logged
    word = f"okapi{uuid.uuid4().hex[:6]}"
    start = service_log.stat().st_size
    _traffic(t, word)
    # A paraphrase, so the verifier runs and logs its decision.
    chat = {"model": "llm", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": f"Which colour is the {word} usually?"}]}
    assert httpx.post(f"{t.openai_base}/chat/completions", json=chat, timeout=60).status_code == 200
    leaks = []
    for line in service_log.read_text(errors="replace")[start:].splitlines():
        if word not in line and "Describe the" not in line and "Which colour" not in line:
            continue
        entry = json.loads(line) if line.startswith("{") else {"raw": line}
        if entry.get("event") in ("verify_decision", "cache_decision"):
            # Only the `detail` field may name words; the prompt itself never appears whole.
            rest = {k: v for k, v in entry.items() if k != "detail"}
            assert word not in json.dumps(rest), entry
            continue
        leaks.append(entry)
    assert leaks == []


@pytest.fixture(scope="module")
def logged_with_text(predictor: Predictor, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("request-log-text")
    t = start_transformer("request-log-text", predictor.grpc, redis_url,
                          "--request-log", str(d / "requests.jsonl"), "--record-prompt-text")
    yield t, d / "requests.jsonl"
    t.process.stop()


def test_prompt_text_has_requests_and_answers(logged_with_text) -> None:
    t, log_path = logged_with_text
    word = f"gecko{uuid.uuid4().hex[:6]}"
    prompts = _traffic(t, word)
    entries = _lines(log_path)
    v2_line = next(e for e in entries if e["protocol"] == "v2-rest" and e["prompt_sha256"] == [
        prompt_hash(prompts[0])])
    assert v2_line["request"]["prompts"] == [prompts[0]]
    assert v2_line["request"]["parameters"]["max_tokens"] == 3
    assert isinstance(v2_line["response"]["texts"][0], str)
    streamed = [e for e in entries if e["route"] == "/openai/v1/chat/completions"
                and e["request"]["body"].get("stream")]
    assert streamed and all(e["response"]["texts"] and e["status"] == 200 for e in streamed)
    assert streamed[0]["request"]["body"]["messages"][0]["content"] == prompts[1]
