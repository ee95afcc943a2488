"""The optional same-answer judge step (cache/judge_step.py) in a real SemanticCache: real Redis, the
real embedder and verifier (shipped scorer), and a scripted judge. The judge may only turn a
grey-zone scorer rejection into a hit, at most once per lookup, and anything but a confident answer
from it is a miss."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import Embedder
from cache.entry_store import EntryStore
from cache.interfaces import Judge
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings, EmbedderSettings, VerifierSettings
from cache.verify import RuleVerifier

from .conftest import chat

EVAL_PAIRS = Path(__file__).resolve().parents[2] / "cache" / "data" / "eval_pairs.jsonl"
# A few hand-written phrasings of one question, for the lookups that need two grey candidates.
OVERHEAT = "What causes my laptop to overheat?"
HOT_RUN, HOT_IS = "Why does my laptop run so hot?", "Why is my laptop so hot?"
ACCEPTED = ("How do I reset my password?", "What's the way to reset my password?")
NEGATED = ("Cancel my subscription", "Don't cancel my subscription")
NUMBER = ("How many ounces are in a pound?", "How many ounces are in 3 pounds?")


class ScriptedJudge:
    """Answers every question with `probability`, or raises `error`, after `delay_s`; records the
    (query, cached) pairs it was asked about."""

    def __init__(
        self, probability: float = 0.95, error: Exception | None = None, delay_s: float = 0.0
    ) -> None:
        self.probability = probability
        self.error = error
        self.delay_s = delay_s
        self.calls: list[tuple[str, str]] = []

    async def same_answer(self, query: str, cached: str) -> float:
        self.calls.append((query, cached))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self.probability


@dataclasses.dataclass(frozen=True)
class Pair:
    cached: str
    query: str
    score: float  # the scorer's probability for it


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(EmbedderSettings())


@pytest.fixture(scope="module")
def verifier() -> RuleVerifier:
    s = CacheSettings()
    return RuleVerifier(VerifierSettings(), max_wrong_rate=s.max_wrong_rate, min_similarity=s.min_similarity)


def scored(embedder: Embedder, verifier: RuleVerifier, cached: str, query: str) -> tuple[float, str, float]:
    """(cosine, rule, score) of the verifier's verdict on a pair, as the cache would reach it."""
    va, vb = embedder.embed_many([cached, query])
    sim = float(np.dot(va, vb))
    v = verifier.check(query, cached, sim)
    return sim, ("accepted" if v.accept else v.rule), v.score


def in_grey_zone(embedder: Embedder, verifier: RuleVerifier, cached: str, query: str) -> float | None:
    sim, rule, score = scored(embedder, verifier, cached, query)
    ok = sim >= CacheSettings().min_similarity and rule == "scorer"
    return score if ok and CacheSettings().judge_min_score <= score < verifier.threshold else None


@pytest.fixture(scope="module")
def grey(embedder: Embedder, verifier: RuleVerifier) -> Pair:
    """A same-answer pair of eval_pairs.jsonl that the scorer rejects by score, in the grey zone."""
    for line in EVAL_PAIRS.read_text().splitlines():
        row = json.loads(line)
        if not row["same_answer"]:
            continue
        score = in_grey_zone(embedder, verifier, row["a"], row["b"])
        if score is not None:
            return Pair(row["a"], row["b"], score)
    raise AssertionError("no same-answer pair of eval_pairs.jsonl is in the scorer's grey zone")


MakeCache = Callable[..., SemanticCache]


@pytest.fixture
def make_cache(
    store: EntryStore, cache_settings: CacheSettings, embedder: Embedder, verifier: RuleVerifier
) -> MakeCache:
    """Caches over one Redis index: make(judge, **CacheSettings overrides)."""

    def make(judge: Judge | None, **settings: float) -> SemanticCache:
        s = dataclasses.replace(cache_settings, **settings)
        return SemanticCache(store, embedder, verifier, s, judge=judge)

    return make


async def test_grey_zone_candidate_is_served_when_the_judge_is_sure(
    make_cache: MakeCache, grey: Pair
) -> None:
    judge = ScriptedJudge(0.95)
    cache = make_cache(judge)
    assert await cache.store(chat(grey.cached), {"text": "cached answer"})
    res = await cache.lookup(chat(grey.query))
    assert res.status == "semantic" and res.answer == {"text": "cached answer"}
    assert res.verdict is not None and res.verdict.accept and res.verdict.rule == "judge"
    assert res.verdict.score == pytest.approx(0.95) and res.cached_prompt == grey.cached
    assert judge.calls == [(grey.query, grey.cached)]
    assert {"judge", "verify"} <= set(res.timings) and res.timings["verify"] >= res.timings["judge"]
    c = cache.counters
    assert (c.judge_calls, c.judge_accepts, c.judge_errors) == (1, 1, 0)


async def test_grey_zone_candidate_is_a_miss_when_the_judge_says_no(
    make_cache: MakeCache, grey: Pair
) -> None:
    judge = ScriptedJudge(0.1)
    cache = make_cache(judge)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    res = await cache.lookup(chat(grey.query))
    assert res.status == "miss" and res.answer is None
    assert res.verdict is not None and not res.verdict.accept and res.verdict.rule == "judge"
    assert res.verdict.score == pytest.approx(0.1) and len(judge.calls) == 1
    c = cache.counters
    assert (c.judge_calls, c.judge_accepts, c.judge_errors) == (1, 0, 0)


async def test_threshold_is_inclusive_and_configurable(make_cache: MakeCache, grey: Pair) -> None:
    cache = make_cache(ScriptedJudge(0.7), judge_threshold=0.7)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    assert (await cache.lookup(chat(grey.query))).status == "semantic"
    stricter = make_cache(ScriptedJudge(0.7), judge_threshold=0.71)
    assert (await stricter.lookup(chat(grey.query))).status == "miss"


async def test_without_a_judge_nothing_changes(make_cache: MakeCache, grey: Pair) -> None:
    cache = make_cache(None)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    res = await cache.lookup(chat(grey.query))
    assert res.status == "miss" and res.verdict is not None and res.verdict.rule == "scorer"
    assert res.verdict.score == pytest.approx(grey.score, abs=0.02) and "judge" not in res.timings
    assert cache.counters.judge_calls == 0


async def test_judge_not_asked_for_exact_hits(make_cache: MakeCache, grey: Pair) -> None:
    judge = ScriptedJudge()
    cache = make_cache(judge)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    assert (await cache.lookup(chat(grey.cached))).status == "exact"
    assert judge.calls == []


async def test_judge_not_asked_for_accepted_candidates(
    make_cache: MakeCache, embedder: Embedder, verifier: RuleVerifier
) -> None:
    cached, query = ACCEPTED
    assert scored(embedder, verifier, cached, query)[1] == "accepted"
    judge = ScriptedJudge(0.0)
    cache = make_cache(judge)
    await cache.store(chat(cached), {"text": "reset it"})
    res = await cache.lookup(chat(query))
    assert res.status == "semantic" and res.verdict is not None and res.verdict.rule == "scorer"
    assert judge.calls == [] and "judge" not in res.timings


async def test_judge_not_asked_when_another_candidate_is_accepted(
    make_cache: MakeCache, embedder: Embedder, verifier: RuleVerifier
) -> None:
    accepted = "Why does my laptop heat up so much?"
    assert scored(embedder, verifier, accepted, OVERHEAT)[1] == "accepted"
    assert in_grey_zone(embedder, verifier, HOT_RUN, OVERHEAT) is not None
    judge = ScriptedJudge(0.95)
    cache = make_cache(judge)
    await cache.store(chat(HOT_RUN), {"text": "grey"})
    await cache.store(chat(accepted), {"text": "accepted"})
    res = await cache.lookup(chat(OVERHEAT))
    assert res.status == "semantic" and res.answer == {"text": "accepted"} and judge.calls == []


@pytest.mark.parametrize("pair", [NEGATED, NUMBER], ids=["negation", "number_hard_rule"])
async def test_judge_not_asked_when_a_rule_objects(
    make_cache: MakeCache, embedder: Embedder, verifier: RuleVerifier, pair: tuple[str, str]
) -> None:
    cached, query = pair
    sim, rule, _ = scored(embedder, verifier, cached, query)
    assert sim >= CacheSettings().min_similarity and rule not in ("accepted", "scorer")
    judge = ScriptedJudge(1.0)
    cache = make_cache(judge, judge_min_score=0.0)  # even with every score in the grey zone
    await cache.store(chat(cached), {"text": "cached answer"})
    res = await cache.lookup(chat(query))
    assert res.status == "miss" and res.verdict is not None and res.verdict.rule == rule
    assert judge.calls == []


async def test_judge_not_asked_under_min_score(make_cache: MakeCache, grey: Pair) -> None:
    judge = ScriptedJudge(1.0)
    cache = make_cache(judge, judge_min_score=min(grey.score + 0.05, 1.0))
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    res = await cache.lookup(chat(grey.query))
    assert res.status == "miss" and res.verdict is not None and res.verdict.rule == "scorer"
    assert judge.calls == [] and cache.counters.judge_calls == 0


@pytest.mark.parametrize(
    "judge",
    [
        ScriptedJudge(error=RuntimeError("predictor down")),
        ScriptedJudge(float("nan")),
        ScriptedJudge(1.5),
    ],
    ids=["raises", "nan", "out_of_range"],
)
async def test_failing_judge_rejects(make_cache: MakeCache, grey: Pair, judge: ScriptedJudge) -> None:
    cache = make_cache(judge)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    res = await cache.lookup(chat(grey.query))
    assert res.status == "miss" and res.answer is None and res.error is None
    assert res.verdict is not None and not res.verdict.accept and res.verdict.rule == "judge_error"
    assert res.verdict.score == pytest.approx(grey.score, abs=0.02)
    c = cache.counters
    assert (c.judge_calls, c.judge_accepts, c.judge_errors) == (1, 0, 1)
    # The judge is not Redis: its failures never take the cache out of the path.
    assert not c.degraded and c.lookups["miss"] == 1
    assert (await cache.lookup(chat(grey.cached))).status == "exact"


async def test_slow_judge_times_out_into_a_miss(make_cache: MakeCache, grey: Pair) -> None:
    judge = ScriptedJudge(1.0, delay_s=5.0)
    cache = make_cache(judge, judge_timeout_ms=100.0)
    await cache.store(chat(grey.cached), {"text": "cached answer"})
    t0 = time.perf_counter()
    res = await cache.lookup(chat(grey.query))
    assert time.perf_counter() - t0 < 2.0
    assert res.status == "miss" and res.verdict is not None and res.verdict.rule == "judge_error"
    assert "timeout" in res.verdict.detail and res.timings["judge"] >= 90.0
    assert (cache.counters.judge_calls, cache.counters.judge_errors) == (1, 1)
    assert cache.counters.timeouts == 0  # counts Redis and embedder budgets only


async def test_one_judge_call_per_lookup_for_the_likeliest_candidate(
    make_cache: MakeCache, embedder: Embedder, verifier: RuleVerifier
) -> None:
    scores = {c: in_grey_zone(embedder, verifier, c, OVERHEAT) for c in (HOT_RUN, HOT_IS)}
    assert None not in scores.values(), scores
    judge = ScriptedJudge(0.1)
    cache = make_cache(judge)
    for cached in scores:
        await cache.store(chat(cached), {"text": cached})
    res = await cache.lookup(chat(OVERHEAT))
    assert res.status == "miss" and res.candidates == 2
    best = max(scores, key=lambda c: scores[c] or 0.0)
    assert judge.calls == [(OVERHEAT, best)] and cache.counters.judge_calls == 1
    # And when it says yes, that candidate's answer is the one served.
    judge.probability = 0.95
    res = await cache.lookup(chat(OVERHEAT))
    assert res.status == "semantic" and res.answer == {"text": best} and len(judge.calls) == 2
