"""semserve cache calibrate-judge's choice of grey zone and threshold (a pure function, table-tested)."""

from __future__ import annotations

import numpy as np
import pytest

from semserve.tooling.cache_eval import Pair
from semserve.tooling.judge_calibration import (
    JudgeChoice,
    PairVerdicts,
    choose,
    holdout_checks,
    intent_halves,
    lower_scorer_threshold,
)


def _verdicts(rows: list[tuple[bool, bool, bool, float]]) -> PairVerdicts:
    same, served, grey, score = zip(*rows, strict=True)
    return PairVerdicts(np.array(same), np.array(served), np.array(grey), np.array(score, dtype=float))


# (same answer, served by the verifier, grey, scorer probability), judge probability (nan: not asked)
BASE = [
    (True, True, False, 0.95), (True, False, False, 0.0),  # served by the scorer; under the floor
    (True, False, True, 0.70), (True, False, True, 0.45),  # grey same-answer pairs
    (False, False, True, 0.75), (False, False, True, 0.50),  # grey look-alikes
    (False, False, False, 0.0), (False, False, False, 0.0),
]


@pytest.mark.parametrize(
    ("judge", "budget", "want"),
    [
        # A judge that separates them: both grey same-answer pairs served, no look-alike.
        ([np.nan, np.nan, 0.9, 0.8, 0.3, 0.2, np.nan, np.nan], 0.0, (0.4, 0.8, 0.75, 0.0)),
        # Only the 0.70 one is above the look-alike at 0.75's judge score: floor 0.7 keeps out
        # the 0.45 pair, whose judge score equals the look-alike's.
        ([np.nan, np.nan, 0.9, 0.3, 0.3, 0.1, np.nan, np.nan], 0.0, (0.7, 0.9, 0.5, 0.0)),
        # A judge that says the opposite adds nothing at budget 0: the scorer alone.
        ([np.nan, np.nan, 0.1, 0.1, 0.9, 0.9, np.nan, np.nan], 0.0, (None, None, 0.25, 0.0)),
        # With a budget of one look-alike in four, it may serve one to gain a same-answer pair
        # (floors 0.7 and 0.4 serve as many: the higher one asks the judge less often).
        ([np.nan, np.nan, 0.1, 0.8, 0.9, 0.2, np.nan, np.nan], 0.25, (0.7, 0.1, 0.5, 0.25)),
    ],
)
def test_choice(judge: list[float], budget: float, want: tuple) -> None:
    c = choose(_verdicts(BASE), np.array(judge), budget)
    assert isinstance(c, JudgeChoice)
    assert (c.min_score, c.threshold, c.served_rate, c.wrong_rate) == pytest.approx(want)
    assert (c.scorer_served_rate, c.scorer_wrong_rate) == (0.25, 0.0)
    assert c.wrong_rate <= budget


def test_no_grey_pairs_means_no_judge() -> None:
    rows = [(True, True, False, 0.9), (False, False, False, 0.0)]
    c = choose(_verdicts(rows), np.array([np.nan, np.nan]), 0.01)
    assert c.min_score is None and c.threshold is None and c.served_rate == 1.0


def _two_halves() -> tuple[PairVerdicts, np.ndarray]:
    """Per half: one pair served by the scorer, two grey same-answer pairs scored under a grey
    look-alike, and two look-alikes the scorer rejected outright."""
    half = [
        (True, True, False, 0.95),
        (True, False, True, 0.50), (True, False, True, 0.40),
        (False, False, True, 0.78),
        (False, False, False, 0.0), (False, False, False, 0.0),
    ]
    return _verdicts(half + half), np.array([0] * 6 + [1] * 6)


def test_a_judge_that_separates_gains_on_held_out_intents() -> None:
    v, halves = _two_halves()
    judge = np.where(v.grey, np.where(v.same, 0.9, 0.1), np.nan)
    for check in holdout_checks(v, judge, 0.0, halves):
        # Lowering the scorer's threshold serves the 0.78 look-alike first: nothing within budget 0.
        assert check.served_gain == pytest.approx(2 / 3)
        assert check.gain_over_lower_threshold == pytest.approx(2 / 3)
        assert check.wrong_rate == 0.0


def test_a_judge_that_tells_nothing_apart_does_not_hold() -> None:
    v, halves = _two_halves()
    judge = np.where(v.grey, 0.5, np.nan)
    for check in holdout_checks(v, judge, 0.0, halves):
        assert check.served_gain <= 0.0 and check.gain_over_lower_threshold <= 0.0


def test_lowering_the_scorer_threshold_spends_the_budget() -> None:
    v, _ = _two_halves()
    # Two look-alikes in six may be served: each half's 0.78 one, and the grey same-answer pairs under it.
    low = lower_scorer_threshold(v, 1 / 3 + 1e-9)
    assert low.min_score == pytest.approx(0.40) and low.served_rate == 1.0
    assert lower_scorer_threshold(v, 0.0).min_score is None
    assert lower_scorer_threshold(v, 1 / 6).min_score is None  # one look-alike alone cannot be served


def test_intent_halves_keep_an_intents_pairs_together() -> None:
    pairs = [
        Pair("reset pin", "forgot pin", True), Pair("reset pin", "change pin", False),
        Pair("parking?", "leave my car?", True), Pair("tax due", "tax late", False),
        Pair("forgot pin", "new pin", True),
    ]
    h = intent_halves(pairs)
    assert h[0] == h[1] == h[4]  # one intent: they share prompts
    assert set(h.tolist()) == {0, 1}
