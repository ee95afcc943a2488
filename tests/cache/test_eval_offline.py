"""The evaluator, offline (embedder + verifier in process) and through the real cache over Redis,
on a small fixture with known outcomes; and the quality regression test on the full labelled sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import Embedder
from cache.interfaces import Verdict
from cache.verify import RuleVerifier, VerifierSettings
from semserve.tooling.cache_eval import (
    GOAL_MAX_WRONG,
    GOAL_MIN_SERVED,
    SPLITS,
    Pair,
    evaluate,
    evaluate_offline,
    evaluate_threshold,
    evaluate_through_cache,
    load_pairs,
    pair_similarities,
)
from semserve.tooling.cache_eval_cli import main
from semserve.tooling.local_redis import RedisServer

# (pair, expected rule). Served exactly when same_answer: every one is decided right today.
FIXTURE: list[tuple[Pair, str]] = [
    (Pair("How do I reset my password?", "how can i reset my password", True, "paraphrase"), "content_clean"),
    (
        Pair("What is the capital of Australia?", "Which city is Australia's capital?", True, "paraphrase"),
        "content_added",
    ),
    (
        Pair(
            "Explain what a closure is in JavaScript", "What is a closure in JavaScript?", True, "paraphrase"
        ),
        "content_clean",
    ),
    (
        Pair(
            "How do I list all running Docker containers?",
            "Show all running docker containers",
            True,
            "paraphrase",
        ),
        "content_added",
    ),
    (Pair("Cheap hotels in London", "Affordable hotels in London", True, "paraphrase"), "content_clean"),
    (Pair("HOW DO I DELETE MY ACCOUNT", "how do I delete my account", True, "near_repeat"), "exact"),
    (
        Pair(
            "What is the differnce between a list and a tuple in Python?",
            "What is the difference between a list and a tuple in Python?",
            True,
            "near_repeat",
        ),
        "content_clean",
    ),
    (
        Pair(
            "Why wont my printer connect to wifi",
            "Why won't my printer connect to Wi-Fi?",
            True,
            "near_repeat",
        ),
        "content_clean",
    ),
    (
        Pair(
            "Give me a three-day itinerary for Lisbon",
            "Give me a 3 day itinerary for Lisbon",
            True,
            "changed_numbers",
        ),
        "content_clean",
    ),
    (
        Pair("Flights to Rome from Paris", "Flights from Paris to Rome", True, "swapped_entities"),
        "content_clean",
    ),
    (Pair("Cancel my subscription", "Don't cancel my subscription", False, "negation"), "negation"),
    (
        Pair("How do I make bread with yeast?", "How do I make bread without yeast?", False, "negation"),
        "negation",
    ),
    (
        Pair("Flights from Paris to Rome", "Flights from Rome to Paris", False, "swapped_entities"),
        "direction",
    ),
    (
        Pair("Is Python faster than Java?", "Is Java faster than Python?", False, "swapped_entities"),
        "direction",
    ),
    (
        Pair(
            "Can I take 2 tablets of ibuprofen at once?",
            "Can I take 20 tablets of ibuprofen at once?",
            False,
            "changed_numbers",
        ),
        "number",
    ),
    (Pair("Is the museum open on Monday?", "Is the museum open on Tuesday?", False, "changed_dates"), "date"),
    (
        Pair("How do I delete all users?", "How do I delete admin users?", False, "changed_scope"),
        "content_substituted",
    ),
    (
        Pair(
            "How do I increase the font size in VS Code?",
            "How do I decrease the font size in VS Code?",
            False,
            "antonym",
        ),
        "antonym",
    ),
    (
        Pair(
            "When was the Eiffel Tower built?", "Why was the Eiffel Tower built?", False, "different_question"
        ),
        "question",
    ),
    (
        Pair(
            "How do I install Docker on Mac?", "How do I install Docker on Windows?", False, "changed_scope"
        ),
        "content_substituted",
    ),
]
PAIRS = [p for p, _ in FIXTURE]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    from cache.embedder import EmbedderSettings

    return Embedder(EmbedderSettings(onnx_dir=tmp_path_factory.mktemp("eval-onnx")))


@pytest.fixture(scope="module")
def fixture_sims(embedder: Embedder) -> np.ndarray:
    return pair_similarities(PAIRS, embedder)


def test_offline_fixture_outcomes(embedder: Embedder, fixture_sims: np.ndarray) -> None:
    rules = RuleVerifier(VerifierSettings(mode="rules"))
    report = evaluate_offline(PAIRS, embedder, rules, similarities=fixture_sims)
    for (pair, rule), out in zip(FIXTURE, report.outcomes, strict=True):
        assert out.served == pair.same_answer, out
        assert out.rule == rule, out
    o = report.overall
    assert (o.n_same, o.n_diff, o.served_same, o.served_diff) == (10, 10, 10, 0)
    assert (o.served_same_rate, o.wrong_served_rate, o.precision) == (1.0, 0.0, 1.0)
    assert set(report.per_category) == {p.category for p in PAIRS}
    assert report.per_category["negation"].n_diff == 2
    assert report.meets_goal


def test_plain_thresholds_serve_the_look_alikes(fixture_sims: np.ndarray) -> None:
    # The reason for the verifier: a cosine cut-off serves most wrong answers of the fixture.
    r80 = evaluate_threshold(PAIRS, fixture_sims, 0.80)
    r90 = evaluate_threshold(PAIRS, fixture_sims, 0.90)
    assert r80.overall.served_diff >= 8
    assert r90.overall.served_diff >= 6


def test_evaluate_with_any_lookup_fn() -> None:
    report = evaluate(PAIRS, lambda p: p.category == "paraphrase")
    o = report.overall
    assert (o.served_same, o.served_diff) == (5, 0)
    assert o.served_same_rate == 0.5
    verdicts = evaluate(PAIRS, lambda p: Verdict(True, "always", 1.0, "test"))
    assert verdicts.overall.wrong_served_rate == 1.0
    assert verdicts.outcomes[0].rule == "always"
    assert verdicts.overall.precision == 0.5


def test_load_pairs_validates(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"a": "x", "b": "y", "same_answer": true, "category": "c"}\n\n')
    assert load_pairs(f) == [Pair("x", "y", True, "c")]
    f.write_text('{"a": "x", "same_answer": true}\n')
    with pytest.raises(ValueError, match="missing field"):
        load_pairs(f)


def test_data_files_are_well_formed() -> None:
    categories = {
        "paraphrase", "near_repeat", "negation", "swapped_entities", "changed_numbers",
        "changed_dates", "changed_scope", "antonym", "different_question",
    }  # fmt: skip
    seen: set[tuple[str, str]] = set()
    for split, minimum in (("eval", 400), ("tune", 150)):
        pairs = load_pairs(SPLITS[split])
        assert len(pairs) >= minimum
        assert {p.category for p in pairs} == categories
        share_true = sum(p.same_answer for p in pairs) / len(pairs)
        assert 0.4 <= share_true <= 0.6
        keys = {(p.a, p.b) for p in pairs}
        assert not keys & seen, "a pair in both splits"
        seen |= keys


# The older hand-written sets are small (85-217 look-alikes): one pair is 0.5-1.2 %, so their bound
# is the 2 % they were held to before issue 13; the project's test split carries the 1 % goal.
SMALL_SET_MAX_WRONG = 0.02


@pytest.mark.parametrize("split", ["eval", "tune"])
def test_default_settings_meet_the_goal(embedder: Embedder, split: str) -> None:
    """Quality regression: deterministic given the model, so a drop is a real regression."""
    pairs = load_pairs(SPLITS[split])
    report = evaluate_offline(pairs, embedder, RuleVerifier(VerifierSettings()))
    o = report.overall
    assert o.wrong_served_rate is not None and o.served_same_rate is not None
    assert o.wrong_served_rate <= SMALL_SET_MAX_WRONG, [m for m in report.mistakes() if m.served]
    assert o.served_same_rate >= GOAL_MIN_SERVED
    # And far better than the plain cut-offs on the same embeddings.
    sims = pair_similarities(pairs, embedder)
    assert evaluate_threshold(pairs, sims, 0.90).overall.wrong_served_rate > 5 * GOAL_MAX_WRONG


def test_test_split_within_the_error_budget(embedder: Embedder) -> None:
    """The held-out split at the default budget: look-alikes served at most 1 % overall and 2 % in
    any category (today: antonym 1 of 88 = 1.1 %, every other category 0), and hits no lower than
    measured when the scorer was shipped (46.8 %; the 60 % goal is not met yet, bench/RESULTS.md).
    A retrained scorer that serves fewer, or more wrongly, fails here."""
    pairs = load_pairs(SPLITS["test"])
    report = evaluate_offline(pairs, embedder, RuleVerifier(VerifierSettings()))
    assert (report.overall.wrong_served_rate or 0.0) <= GOAL_MAX_WRONG
    for cat, f in report.per_category.items():
        if f.n_diff:
            assert (f.wrong_served_rate or 0.0) <= 2 * GOAL_MAX_WRONG, (cat, f.as_dict())
    assert (report.overall.served_same_rate or 0.0) >= 0.45


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fixture.jsonl"
    f.write_text("".join(json.dumps(p.__dict__) + "\n" for p in PAIRS))
    code = main(["--pairs", str(f), "--json", "--outcomes", "--onnx-dir", str(tmp_path / "onnx")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    split = doc["splits"]["fixture"]
    assert set(split) == {"verifier", "rules-only", "cosine>=0.80", "cosine>=0.90"}
    assert split["verifier"]["overall"]["wrong_served_rate"] == 0.0
    assert len(split["verifier"]["outcomes"]) == len(PAIRS)


async def test_through_the_real_cache_matches_offline(
    redis_server: RedisServer, clean_redis: object, embedder: Embedder, fixture_sims: np.ndarray
) -> None:
    from cache.entry_store import EntryStore
    from cache.semantic_cache import SemanticCache
    from tests.cache.conftest import make_settings

    settings = make_settings(redis_server.url)

    async def make_cache() -> SemanticCache:
        store = EntryStore.from_settings(settings)
        cache = SemanticCache(store, embedder, RuleVerifier(VerifierSettings(mode="rules")), settings)
        await cache.start()
        return cache

    real = await evaluate_through_cache(PAIRS, make_cache)
    rules = RuleVerifier(VerifierSettings(mode="rules"))
    offline = evaluate_offline(PAIRS, embedder, rules, similarities=fixture_sims)
    assert [o.served for o in real.outcomes] == [o.served for o in offline.outcomes]
    assert real.overall.wrong_served_rate == 0.0
