"""The same-answer judge end to end (--cache-judge predictor): a real transformer and Redis in front of
the real predictor, whose `llm-judge` model is asked about a grey-zone candidate the scorer turned
down. Judge floor and threshold 0 here, so the outcome does not hang on what SmolLM2 thinks of the
pair: the test is that the question is asked and the answer obeyed, or that a failure is a miss."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import Predictor, Transformer, start_transformer
from tests.support import metric_value

# A same-answer pair of cache/data/eval_pairs.jsonl that the shipped scorer rejects by score alone,
# in its grey zone (probability about 0.78 against the 0.83 threshold); tests/cache/test_judge_step.py
# checks how such pairs are picked, this test checks its own pair's verdict without a judge.
CACHED = "How do I get a refund for a duplicate charge?"
QUERY = "I was charged twice, how do I get my money back?"
JUDGE_FLAGS = ("--cache-judge", "predictor", "--cache-judge-min-score", "0", "--cache-judge-threshold", "0")


def chat(t: Transformer, content: str) -> httpx.Response:
    body = {"model": "llm", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 16}
    r = httpx.post(f"{t.openai_base}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def decisions(log_path: Path, start: int = 0) -> list[dict]:
    """The transformer's cache_decision log lines (debug level) written since byte `start`."""
    text = log_path.read_bytes()[start:].decode(errors="replace")
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == "cache_decision"]


def counter(t: Transformer, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{t.http}/metrics", timeout=30).text, name, **labels)


@contextmanager
def transformer_with(name: str, predictor: Predictor, redis_url: str, *flags: str) -> Iterator[Transformer]:
    """A transformer of its own: a fresh name, so its own index and its own log file."""
    t = start_transformer(f"{name}-{uuid.uuid4().hex[:6]}", predictor.grpc, redis_url,
                          "--log-level", "debug", *flags)
    try:
        yield t
    finally:
        t.process.stop()


def test_grey_zone_paraphrase_is_served_on_the_judge_word(predictor: Predictor, redis_url: str) -> None:
    with transformer_with("judge", predictor, redis_url, *JUDGE_FLAGS,
                          "--cache-judge-timeout-ms", "60000") as t:
        first = chat(t, CACHED)
        assert first.headers["x-semserve-cache"] == "miss"
        para = chat(t, QUERY)
        assert para.headers["x-semserve-cache"] == "semantic"
        answer = first.json()["choices"][0]["message"]["content"]
        assert para.json()["choices"][0]["message"]["content"] == answer
        rules = [d["rule"] for d in decisions(t.process.log_path)]
        assert rules == ["judge"], rules
        assert counter(t, "semserve_cache_judge_calls_total") == 1
        assert counter(t, "semserve_cache_judge_accepts_total") == 1
        assert counter(t, "semserve_cache_judge_errors_total") == 0
        # The probability came from the predictor's judge model, over gRPC.
        assert counter(t, "semserve_transformer_predictor_calls_total", model_name="llm-judge",
                       outcome="ok") == 1


def test_failing_judge_is_a_miss(predictor: Predictor, redis_url: str) -> None:
    # A judge budget no predictor call can meet: every judge call fails (times out), without having
    # to take the predictor's judge model away.
    with transformer_with("judge-fail", predictor, redis_url, *JUDGE_FLAGS,
                          "--cache-judge-timeout-ms", "0.01") as t:
        assert chat(t, CACHED).headers["x-semserve-cache"] == "miss"
        assert chat(t, QUERY).headers["x-semserve-cache"] == "miss"
        found = decisions(t.process.log_path)
        assert [d["rule"] for d in found] == ["judge_error"], found
        assert counter(t, "semserve_cache_judge_errors_total") == 1
        assert counter(t, "semserve_cache_judge_accepts_total") == 0


def test_without_the_flag_the_scorer_rejects_the_pair(transformer: Transformer) -> None:
    """The precondition, on the suite's default transformer (no judge): this pair is a scorer miss."""
    start = transformer.process.log_path.stat().st_size
    chat(transformer, CACHED)
    assert chat(transformer, QUERY).headers["x-semserve-cache"] == "miss"
    rules = [d["rule"] for d in decisions(transformer.process.log_path, start)]
    assert rules[-1] == "scorer", rules
