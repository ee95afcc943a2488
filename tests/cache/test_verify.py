"""Each verifier rule on crafted look-alike pairs: it must veto the wrong ones whatever the cosine
(0.97 here: the look-alikes embed that close) and keep the true paraphrases."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from cache.interfaces import Verdict, Verifier
from cache.verify import RuleVerifier, VerifierSettings, analyze, content_diff

HIGH = 0.97  # look-alike prompts embed about this close


@pytest.fixture(scope="module")
def verifier() -> RuleVerifier:
    return RuleVerifier(VerifierSettings(mode="rules"))


REJECT = [
    # negation
    ("negation", "cancel my subscription", "don't cancel my subscription"),
    ("negation", "Show me hotels in Rome with free parking", "Show me hotels in Rome without parking"),
    ("negation", "Why is my phone charging slowly?", "Why is my phone not charging?"),
    ("negation", "Jobs that require a degree", "Jobs that dont require a degree"),
    ("negation", "Gluten recipes", "Gluten-free recipes"),
    # numbers, units, versions, codes
    ("number", "Can I take 3 tablets of ibuprofen?", "Can I take 30 tablets of ibuprofen?"),
    ("number", "Is 5 mg of melatonin too much?", "Is 5 g of melatonin too much?"),
    ("number", "What's new in Python 3.12?", "What's new in Python 3.11?"),
    ("number", "Give me a three-day itinerary for Rome", "Give me a 7-day itinerary for Rome"),
    ("number", "How many calories does walking 10,000 steps burn?", "... walking 5,000 steps burn?"),
    ("number", "What does error 0x80070005 mean?", "What does error 0x80070057 mean?"),
    ("number", "Convert 100 USD to EUR", "Convert 100 GBP to EUR"),
    # dates and times
    ("number", "Tax filing deadlines for 2023", "Tax filing deadlines for 2024"),
    ("date", "Is the museum open on Monday?", "Is the museum open on Tuesday?"),
    ("date", "Weather forecast for Paris tomorrow", "Weather forecast for Paris today"),
    ("date", "Events in Berlin this weekend", "Events in Berlin next weekend"),
    ("date", "Things to do in London in December", "Things to do in London in July"),
    ("date", "What's the weather in Oslo?", "What's the weather in Oslo tonight?"),
    # question type
    ("question", "How do cats purr?", "Why do cats purr?"),
    ("question", "When was the Eiffel Tower built?", "Why was the Eiffel Tower built?"),
    ("question", "Can I get a refund?", "When will I get a refund?"),
    ("question", "Where is the Louvre?", "How big is the Louvre?"),
    # antonyms, lexical and by prefix
    ("antonym", "How do I increase the font size?", "How do I decrease the font size?"),
    ("antonym", "Should I take it before meals?", "Should I take it after meals?"),
    ("antonym", "Find the max value in a list", "Find the min value in a list"),
    ("antonym", "How do I install Homebrew?", "How do I uninstall Homebrew?"),
    ("antonym", "How to encrypt a file with GPG", "How to decrypt a file with GPG"),
    ("antonym", "How to fix overcooked rice", "How to fix undercooked rice"),
    ("antonym", "How do I turn on Bluetooth?", "How do I turn off Bluetooth?"),
    ("antonym", "Flights to Rome", "Flights from Rome"),
    # direction: swapped arguments
    ("direction", "Flights from Paris to Rome", "Flights from Rome to Paris"),
    ("direction", "Alice owes Bob 50 dollars", "Bob owes Alice 50 dollars"),
    ("direction", "How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("direction", "Is Python faster than Java?", "Is Java faster than Python?"),
    ("direction", "What is 12 divided by 4?", "What is 4 divided by 12?"),
    ("direction", "Can a dog eat cat food?", "Can a cat eat dog food?"),
    (
        "direction",
        "Move my appointment from Tuesday to Thursday",
        "Move my appointment from Thursday to Tuesday",
    ),
    # scope: a proper noun or a code added/substituted is never served
    ("content_substituted", "Best restaurants in Europe", "Best restaurants in France"),
    ("content_added", "How do I install Docker?", "How do I install Docker on Windows?"),
    (
        "content_added",
        "How do I center a div horizontally?",
        "How do I center a div horizontally and vertically?",
    ),
]

KEEP = [
    ("How do I reset my password?", "how can i reset my password"),
    ("How do I reset my password?", "How do I reset my pasword?"),
    ("Can you please tell me how to reset my password?", "How do I reset my password?"),
    ("I can't log in to my account", "I cannot log into my account"),
    ("Why won't my car start?", "Why does my car not start?"),
    ("Recipes without dairy", "Dairy-free recipes"),
    ("I never received my refund", "I didn't get my refund"),
    ("Give me a three-day itinerary for Lisbon", "Give me a 3 day itinerary for Lisbon"),
    ("Cookie recipe for a dozen cookies", "Cookie recipe that makes 12 cookies"),
    ("How many ounces are in a pound?", "How many oz are in 1 lb?"),
    ("Is 100°F a fever?", "Is 100 degrees Fahrenheit a fever?"),
    ("What is 15 percent of 80?", "What's 15% of 80?"),
    ("Is the museum open on Monday?", "Is the museum open on Mondays?"),
    ("Events in Berlin on Sat", "Events in Berlin on Saturday"),
    ("What happened on 4 July 1776?", "What happened on July 4th, 1776?"),
    ("Is there a way to export my data?", "How do I export my data?"),
    ("How do I report a bug in the app?", "Where do I report a bug in the app?"),
    ("What's the best time to visit Bali?", "When is the best time to visit Bali?"),
    ("How do I turn on Bluetooth?", "How do I switch on Bluetooth?"),
    ("Flights to Rome from Paris", "Flights from Paris to Rome"),
    ("Compare Python and Ruby for web development", "Compare Ruby and Python for web development"),
    ("Is a tomato a fruit or a vegetable?", "Is a tomato a vegetable or a fruit?"),
    ("How do I check the weather in Madrid?", "Madrid weather, how do I check it?"),
    ("How do I format a date in Java?", "Java date formatting, how?"),
    ("Cheap hotels in London", "Affordable hotels in London"),
    ("How do I set up a VPN?", "How do I setup a VPN?"),
    ("What is an e-mail alias?", "What is an email alias?"),
    ("How do I make a website responsive?", "How do I make a web site responsive?"),
    ("Who won the World Cup in 2018?", "Who won the 2018 World Cup?"),
]


@pytest.mark.parametrize(("rule", "query", "candidate"), REJECT, ids=[f"{r}:{q}" for r, q, _ in REJECT])
def test_rejects_look_alikes(verifier: RuleVerifier, rule: str, query: str, candidate: str) -> None:
    for q, c in ((query, candidate), (candidate, query)):  # symmetric: either one may be cached
        v = verifier.check(q, c, HIGH)
        assert not v.accept, v
        assert v.rule == rule, v
        assert v.detail


@pytest.mark.parametrize(("query", "candidate"), KEEP, ids=[q for q, _ in KEEP])
def test_keeps_paraphrases(verifier: RuleVerifier, query: str, candidate: str) -> None:
    for q, c in ((query, candidate), (candidate, query)):
        v = verifier.check(q, c, HIGH)
        assert v.accept, v


def test_verdict_shape_and_protocol(verifier: RuleVerifier) -> None:
    assert isinstance(verifier, Verifier)
    v = verifier.check("How do I reset my password?", "how do i reset my password", 0.99)
    assert isinstance(v, Verdict)
    assert (v.accept, v.rule, v.score) == (True, "exact", 0.99)


def test_similarity_floor(verifier: RuleVerifier) -> None:
    v = verifier.check("How do I bake bread?", "How do I bake a cake?", 0.5)
    assert (v.accept, v.rule) == (False, "below_floor")


def test_clean_match_needs_accept_clean() -> None:
    v = RuleVerifier(VerifierSettings(mode="rules", accept_clean=0.8))
    assert v.check("how can i reset my password", "How do I reset my password?", 0.81).accept
    low = v.check("how can i reset my password", "How do I reset my password?", 0.79)
    assert (low.accept, low.rule) == (False, "content_clean")


def test_substituted_word_needs_a_very_high_cosine(verifier: RuleVerifier) -> None:
    s = verifier.settings
    q, c = "How do I sort a list in Python?", "How do I sort a tuple in Python?"
    assert content_diff(analyze(q), analyze(c)).only_a == ("list",)
    below = verifier.check(q, c, s.accept_substituted - 0.01)
    assert (below.accept, below.rule) == (False, "content_substituted")
    assert verifier.check(q, c, s.accept_substituted + 0.01).accept


def test_added_word_needs_accept_added(verifier: RuleVerifier) -> None:
    s = verifier.settings
    q, c = "How do I cook salmon in the oven?", "How do I cook salmon?"
    v = verifier.check(q, c, s.accept_added - 0.01)
    assert (v.accept, v.rule) == (False, "content_added")
    assert verifier.check(q, c, s.accept_added + 0.01).accept


def test_added_proper_noun_is_never_served(verifier: RuleVerifier) -> None:
    v = verifier.check("Best beaches in Spain near Barcelona", "Best beaches in Spain", 0.995)
    assert not v.accept
    assert "barcelona" in v.detail


def test_synonyms_typos_and_split_words_match() -> None:
    for q, c in [
        ("How do I fix my car?", "How do I repair my vehicle?"),
        ("What are the symptons of strep throat?", "What are the symptoms of strep throat?"),
        ("How do I log in to the admin panel?", "How do I login to the admin panel?"),
        ("Recommend a good sci fi novel", "Recommend a good sci-fi novel"),
    ]:
        d = content_diff(analyze(q), analyze(c))
        assert d.only_a == () and d.only_b == (), (q, c, d)


def test_number_words_and_ordinals_are_normalized() -> None:
    assert {v for v, _u, _w in analyze("four hundred mg of ibuprofen").quantities} == {"400"}
    assert {v for v, _u, _w in analyze("take 400mg").quantities} == {"400"}
    assert analyze("July 4th").quantities[0][0] == "4"
    assert analyze("10,000 steps").quantities[0][0] == "10000"
    assert analyze("$60 tip").quantities[0][1] == "usd"


def test_disabled_rules_are_skipped() -> None:
    v = RuleVerifier(VerifierSettings(mode="rules", disabled_rules="negation"))
    assert v.check("cancel my subscription", "don't cancel my subscription", HIGH).rule != "negation"
    with pytest.raises(ValueError):
        RuleVerifier(VerifierSettings(disabled_rules="telepathy"))


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEMSERVE_VERIFY_ACCEPT_ADDED", "0.95")
    monkeypatch.setenv("SEMSERVE_VERIFY_DISABLED_RULES", "date,antonym")
    s = VerifierSettings.from_env()
    assert s.accept_added == 0.95
    assert RuleVerifier(s).disabled == {"date", "antonym"}


def test_decision_is_logged_with_rule_and_score(
    verifier: RuleVerifier, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="semserve.cache.verify"):
        verifier.check("Flights from Paris to Rome", "Flights from Rome to Paris", 0.96)
    rec = [r for r in caplog.records if r.getMessage() == "verify_decision"][-1]
    fields = rec.fields  # type: ignore[attr-defined]
    assert fields["rule"] == "direction"
    assert fields["score"] == 0.96
    assert fields["accept"] is False


def test_similarity_floor_is_the_cache_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # One min_similarity: CacheSettings owns it; the verifier takes it like the error budget.
    from cache.settings import CacheSettings

    assert "min_similarity" not in {f.name for f in dataclasses.fields(VerifierSettings)}
    q, c = "how can i reset my password", "How do I reset my password?"
    strict = RuleVerifier(VerifierSettings(mode="rules"), min_similarity=0.9)
    assert strict.check(q, c, 0.85).rule == "below_floor"
    monkeypatch.setenv("SEMSERVE_CACHE_MIN_SIMILARITY", "0.9")
    assert CacheSettings.from_env().min_similarity == 0.9
    assert RuleVerifier(VerifierSettings(mode="rules")).check(q, c, 0.85).rule == "below_floor"
    monkeypatch.delenv("SEMSERVE_CACHE_MIN_SIMILARITY")
    assert RuleVerifier(VerifierSettings(mode="rules")).check(q, c, 0.85).accept
