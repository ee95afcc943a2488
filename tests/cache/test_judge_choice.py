"""semserve cache calibrate-judge's choice of grey zone and threshold (a pure function, table-tested)."""

from __future__ import annotations

import numpy as np
import pytest

from semserve.tooling.judge_calibration import JudgeChoice, PairVerdicts, choose


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
