"""The learned scorer (issue 13): each look-alike kind rejected and each paraphrase style served,
on pairs written here by hand (none is in cache/data: the scorer never trained on them), through
the real embedder and the shipped scorer at the default error budget; the error budget's effect;
non-English failing closed; the pair set's construction; `semserve cache eval --plot`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cache.embedder import Embedder, EmbedderSettings
from cache.interfaces import Verdict
from cache.pairfeatures import FEATURE_NAMES, pair_features
from cache.scorer import PairScorer, calibration_curve, default_scorer
from cache.settings import CacheSettings
from cache.verify import RuleVerifier, VerifierSettings
from semserve.tooling import pair_generation
from semserve.tooling.cache_eval import SPLITS, load_pairs
from semserve.tooling.cache_eval_cli import main

KNN_FLOOR = CacheSettings().min_similarity

# (cached prompt, new prompt). Must be served.
SERVE = {
    "near_repeat_case": ("How do I cancel my gym membership?", "how do i cancel my gym membership"),
    "near_repeat_typo": ("What is the boiling point of milk?", "What is the boiling piont of milk?"),
    "near_repeat_filler": ("Can I bring my cat on the train?", "Hi, can I bring my cat on the train?"),
    "near_repeat_shouted": ("Where is the nearest pharmacy?", "WHERE IS THE NEAREST PHARMACY"),
    "paraphrase_which_city": ("What is the capital of Peru?", "Which city is the capital of Peru?"),
    "paraphrase_synonym": ("How do I delete my LinkedIn account?", "How can I remove my LinkedIn account?"),
    "paraphrase_aux": ("Is the museum open on public holidays?", "Does the museum open on public holidays?"),
    "reworded_where_is": ("Where's my parcel?", "Could you tell me where my parcel is right now?"),
    "reworded_forgot": ("How do I reset my router password?", "I forgot my router password, what now?"),
    "reworded_keywords": ("How do I export my Chrome bookmarks?", "Chrome bookmarks export"),
}

# Same answer, missed today (the reworded share on the test split is 17 %): pinned as known misses,
# so the day the scorer serves them the test says so (strict xfail) and they move up.
SERVE_KNOWN_MISSES = {
    "paraphrase_update_change": (
        "How do I update my shipping address?",
        "How can I change my shipping address?",
    ),
    "reworded_car_parking": (
        "Is there parking at the museum?",
        "Can I leave my car somewhere at the museum?",
    ),
    "reworded_dont_want": (
        "How do I unsubscribe from your newsletter?",
        "I don't want your newsletter emails anymore, how do I stop them?",
    ),
}

# Must never be served.
REJECT = {
    "negation_affix": ("Is this hotel room refundable?", "Is this hotel room non-refundable?"),
    "negation_keep_from": (
        "How do I reset my account password?",
        "How do I keep my account password from being reset?",
    ),
    "negation_cant": ("Can I take aspirin with coffee?", "Why can't I take aspirin with coffee?"),
    "negation_not": ("Which apps sync with Outlook?", "Which apps do not sync with Outlook?"),
    "antonym_eat_avoid": ("What should I eat before a long run?", "What should I avoid before a long run?"),
    "antonym_within_after": (
        "Can I return shoes within the return window?",
        "Can I return shoes after the return window?",
    ),
    "antonym_enable_disable": ("How do I enable dark mode in Slack?", "How do I disable dark mode in Slack?"),
    "antonym_import_export": ("How do I import contacts into Gmail?", "How do I export contacts from Gmail?"),
    "swapped_route": (
        "How long is the train from Milan to Venice?",
        "How long is the train from Venice to Milan?",
    ),
    "swapped_entity": ("Can rabbits eat carrots?", "Can rabbits eat onions?"),
    "swapped_country": ("What is the population of Chile?", "What is the population of Peru?"),
    "number_dose": ("Is 20 mg of melatonin safe?", "Is 2 mg of melatonin safe?"),
    "number_weekday": (
        "What time does the pharmacy close on Saturday?",
        "What time does the pharmacy close on Sunday?",
    ),
    "number_distance": ("Convert 5 miles to kilometers", "Convert 50 miles to kilometers"),
    "scope_narrower": (
        "How do I back up my iPhone?",
        "How do I back up only my iPhone photos to an external drive?",
    ),
    "scope_conditions": (
        "What is the speed limit on highways in France?",
        "What is the speed limit on highways in France for trucks in rain?",
    ),
    "different_question": ("How do I apply for a mortgage?", "How long does mortgage approval take?"),
    "different_question_fee": (
        "What is the visa fee for Kenya?",
        "How long does a Kenya visa take to process?",
    ),
}

NON_ENGLISH = {
    "german_negation": ("Kann ich das Ticket stornieren?", "Kann ich das Ticket nicht stornieren?"),
    "spanish_paraphrase": ("¿Cómo restablezco mi contraseña?", "¿Cómo puedo restablecer mi contraseña?"),
    "french_swap": ("Le train de Paris à Lyon", "Le train de Lyon à Paris"),
    "russian": ("Как сбросить пароль?", "Как не сбрасывать пароль?"),
}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    return Embedder(EmbedderSettings(onnx_dir=tmp_path_factory.mktemp("scorer-onnx")))


@pytest.fixture(scope="module")
def verifier() -> RuleVerifier:
    return RuleVerifier(VerifierSettings(), max_wrong_rate=CacheSettings().max_wrong_rate)


def decide(embedder: Embedder, verifier: RuleVerifier, cached: str, query: str) -> Verdict | None:
    """What the cache does: the KNN floor, then the verifier (None: never reached it)."""
    va, vb = embedder.embed_many([cached, query])
    sim = float(np.dot(va, vb))
    if sim < KNN_FLOOR:
        return None
    return verifier.check(query, cached, sim)


def test_the_hand_written_pairs_are_not_in_the_data() -> None:
    seen = {(p.a, p.b) for s in ("train", "calib", "test") for p in load_pairs(SPLITS[s])}
    seen |= {(b, a) for a, b in seen}
    texts = {t for pair in seen for t in pair}
    for name, (a, b) in {**SERVE, **SERVE_KNOWN_MISSES, **REJECT}.items():
        assert (a, b) not in seen, name
        assert not ({a, b} <= texts), name


@pytest.mark.parametrize("name", sorted(SERVE))
def test_serves_paraphrase_styles(embedder: Embedder, verifier: RuleVerifier, name: str) -> None:
    cached, query = SERVE[name]
    v = decide(embedder, verifier, cached, query)
    assert v is not None and v.accept, v
    assert v.rule in ("exact", "scorer")


@pytest.mark.xfail(strict=True, reason="known miss: reworded beyond what MiniLM + the features see")
@pytest.mark.parametrize("name", sorted(SERVE_KNOWN_MISSES))
def test_known_misses(embedder: Embedder, verifier: RuleVerifier, name: str) -> None:
    cached, query = SERVE_KNOWN_MISSES[name]
    v = decide(embedder, verifier, cached, query)
    assert v is not None and v.accept


@pytest.mark.parametrize("name", sorted(REJECT))
def test_rejects_look_alikes(embedder: Embedder, verifier: RuleVerifier, name: str) -> None:
    cached, query = REJECT[name]
    v = decide(embedder, verifier, cached, query)
    assert v is None or not v.accept, v
    if v is not None:
        # Explainable: the verdict names a rule or the score, and says why.
        assert v.rule and v.detail


@pytest.mark.parametrize("name", sorted(NON_ENGLISH))
def test_non_english_fails_closed(verifier: RuleVerifier, name: str) -> None:
    cached, query = NON_ENGLISH[name]
    v = verifier.check(query, cached, 0.99)
    # "empty": nothing Latin-script left to compare. Identical repeats are the exact layer's
    # (a hash of the prompt), which serves them whatever the language.
    assert not v.accept and v.rule in ("unsupported_language", "empty"), v


def test_verdict_names_the_deciding_rule(verifier: RuleVerifier) -> None:
    assert verifier.check("Is 5 mg safe?", "Is 50 mg safe?", 0.95).rule == "number"  # hard rule
    v = verifier.check("Which apps do not sync with Outlook?", "Which apps sync with Outlook?", 0.96)
    assert (v.accept, v.rule) == (False, "negation") and "score" in v.detail
    ok = verifier.check("How can I remove my LinkedIn account?", "How do I delete my LinkedIn account?", 0.96)
    assert (ok.accept, ok.rule) == (True, "scorer") and 0.0 <= ok.score <= 1.0


def test_error_budget_moves_the_threshold() -> None:
    scorer = default_scorer()
    strict = RuleVerifier(VerifierSettings(), max_wrong_rate=0.0)
    loose = RuleVerifier(VerifierSettings(), max_wrong_rate=0.05)
    assert strict.threshold > loose.threshold
    point = scorer.threshold_for(0.01)
    assert point.wrong_rate <= 0.01
    # More budget never means fewer hits on the calibration curve.
    assert scorer.threshold_for(0.05).served_rate >= point.served_rate
    with pytest.raises(ValueError):
        RuleVerifier(VerifierSettings(), max_wrong_rate=1.5)


def test_policy_hands_its_budget_to_the_verifier() -> None:
    from cache.semantic_cache import SemanticCache

    v = RuleVerifier(VerifierSettings(), max_wrong_rate=0.01)
    cache = SemanticCache.__new__(SemanticCache)  # only the decision path; no Redis
    cache.verifier, cache.settings = v, CacheSettings(max_wrong_rate=0.05)
    cache.counters = type("C", (), {"verifier_errors": 0})()
    cache._failing = {}
    cache._verify("How can I remove my LinkedIn account?", "How do I delete my LinkedIn account?", 0.96)
    assert v.max_wrong_rate == 0.05 and v.threshold == default_scorer().threshold_for(0.05).threshold


def test_calibration_curve_and_threshold_choice() -> None:
    probs = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.8, 0.9, 0.95])
    same = np.array([False, False, False, True, False, True, True, True])
    doc = {"format": 1, "features": list(FEATURE_NAMES), "baseline": 0.0, "trees": [], "calibration": []}
    s = PairScorer(doc)
    s.calibration = calibration_curve(probs, same)
    p0 = s.threshold_for(0.0)
    assert p0.threshold > 0.7 and p0.served_rate == 0.75
    p = s.threshold_for(0.25)
    assert p.threshold <= 0.3 + 1e-6 and (p.wrong_rate, p.served_rate) == (0.25, 1.0)


def test_features_are_finite_and_named() -> None:
    x, vetoes = pair_features("Is this fare refundable?", "Is this fare non-refundable?", 0.97)
    assert x.shape == (len(FEATURE_NAMES),) and np.isfinite(x).all()
    assert "rule_negation" in vetoes


def test_shipped_scorer_matches_the_features() -> None:
    s = default_scorer()
    assert s.n_trees > 0 and s.calibration
    assert s.meta["calib_files"] == ["pairs_calib.jsonl"]


def test_pair_set_is_deterministic_and_split_by_seed(tmp_path: Path) -> None:
    built = pair_generation.build()
    for split, rows in built.items():
        on_disk = [json.loads(line) for line in SPLITS[split].read_text().splitlines()]
        assert rows == on_disk, f"{split}: regenerate with `semserve cache pairs`"
    groups = {s: {r["group"] for r in rows} for s, rows in built.items()}
    assert not groups["train"] & groups["test"] and not groups["calib"] & groups["test"]
    assert not groups["train"] & groups["calib"]
    total = sum(len(r) for r in built.values())
    assert total >= 3000
    cats = {r["category"] for rows in built.values() for r in rows}
    assert set(pair_generation.SAME_CATEGORIES) | set(pair_generation.TRAP_CATEGORIES) == cats
    for rows in built.values():
        assert all(r["same_answer"] == (r["category"] in pair_generation.SAME_CATEGORIES) for r in rows)


def test_seed_parser_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown trap kind"):
        pair_generation.parse_seeds("== x | d\n= a\n! sarcasm: b\n")


def test_eval_cli_prints_categories_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "mini.jsonl"
    rows = [
        {"a": a, "b": b, "same_answer": True, "category": "paraphrase"} for a, b in list(SERVE.values())[:4]
    ] + [{"a": a, "b": b, "same_answer": False, "category": "negation"} for a, b in list(REJECT.values())[:4]]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = tmp_path / "curve.png"
    code = main(
        ["--pairs", str(f), "--plot", str(png), "--cache-max-wrong-rate", "0.01",
         "--onnx-dir", str(tmp_path / "onnx")]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "per category" in out and "negation" in out and "paraphrase" in out
    assert "rules-only" in out and "cosine>=0.90" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _HashEmbedder:
    """Deterministic stand-in: bag of hashed words, unit length (no model, so training is quick)."""

    def embed_many(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, hash(w) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_train_writes_a_loadable_calibrated_scorer(tmp_path: Path) -> None:
    from semserve.tooling.scorer_training import train

    pairs = load_pairs(SPLITS["train"])[:300]
    calib = load_pairs(SPLITS["calib"])[:120]
    doc = train(pairs, calib, _HashEmbedder(), {"note": "test"})
    path = tmp_path / "scorer.json"
    path.write_text(json.dumps(doc))
    s = PairScorer.load(path)
    assert s.n_trees > 0 and s.calibration and s.meta["n_train"] == 300
    assert 0 < s.meta["n_train_judged"] < 300 and s.meta["min_similarity"] == CacheSettings().min_similarity
    x, _ = pair_features("How do I reset my PIN?", "How can I reset my PIN?", 0.95)
    assert 0.0 <= s.probability(x) <= 1.0
    v = RuleVerifier(VerifierSettings(scorer_path=path), max_wrong_rate=0.01)
    assert v.scorer is not None and v.threshold == s.threshold_for(0.01).threshold


def test_training_rows_follow_the_verifiers_path() -> None:
    """Only pairs the scorer decides at serving time train it; the rest are decided before it."""
    from semserve.tooling.cache_eval import Pair
    from semserve.tooling.scorer_training import pair_rows

    pairs = [
        Pair("How do I reset my PIN?", "how do I reset my pin", True),  # exact after normalization
        Pair("Is 5 mg safe?", "Is 50 mg safe?", False),  # the hard number rule vetoes
        Pair("Where is my parcel?", "Could you tell me where my delivery is?", True),  # under the floor
        Pair("How do I delete my account?", "How can I remove my account?", True),  # the scorer judges
    ]
    rows = pair_rows(pairs, np.array([1.0, 0.95, 0.55, 0.9]), 0.65, frozenset({"number"}))
    assert rows.x.shape == (4, len(FEATURE_NAMES))
    assert rows.exact.tolist() == [True, False, False, False]
    assert rows.judged.tolist() == [False, False, False, True]
    # Without the hard rule the number pair reaches the scorer.
    assert pair_rows(pairs, np.array([1.0, 0.95, 0.55, 0.9]), 0.65, frozenset()).judged[1]


def test_calibrate_only_keeps_the_trees(tmp_path: Path) -> None:
    """`semserve cache train --calibrate-only`: same trees, a curve from the given pairs, and the
    floor and hard rules it holds for in the file's meta."""
    from semserve.tooling.scorer_training import calibrate

    shipped = json.loads(Path(default_scorer().source).read_text())
    calib = load_pairs(SPLITS["calib"])[:150]
    doc = calibrate(shipped, calib, _HashEmbedder(), min_similarity=0.5)
    assert doc["trees"] == shipped["trees"] and doc["calibration"] != shipped["calibration"]
    assert doc["meta"]["min_similarity"] == 0.5 and doc["meta"]["hard_rules"] == ["number"]
    assert doc["meta"]["n_calib"] == 150
    # The curve counts what the verifier would do: a pair under the floor is never served.
    under = [p for p in calib if not p.same_answer][:5]
    far = calibrate(shipped, under, _HashEmbedder(), min_similarity=1.01)
    assert all(p["wrong_rate"] == 0.0 for p in far["calibration"] if p["threshold"] > 0.0)
