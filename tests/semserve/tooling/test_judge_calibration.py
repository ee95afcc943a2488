"""`semserve cache calibrate-judge` against the real predictor's judge model: the pairs it asks about are
exactly the verifier's grey ones, the judge's answers come back over v2 REST, and the choice it prints
keeps within the budget on the pairs it read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from semserve.tooling.cache_eval import load_pairs
from semserve.tooling.judge_calibration import MIN_SCORES, judge_probabilities, verdicts
from semserve.tooling.pair_generation import DATA_DIR
from tests.conftest import Predictor

# Thirty labelled pairs of the older hand-written set (not the scorer's training or calibration data).
PAIRS = load_pairs(DATA_DIR / "eval_pairs.jsonl")[:30]


def test_grey_pairs_are_the_verifiers_rejections_by_score() -> None:
    v = verdicts(PAIRS, 0.01, 0.65)
    assert v.grey.any(), "no grey pair among the thirty: pick other pairs"
    assert not (v.grey & v.served).any()
    assert (v.score[v.grey] > 0).all() and (v.score[v.grey] < 1).all()


async def test_judge_probabilities_over_rest(predictor: Predictor) -> None:
    probs = await judge_probabilities(PAIRS[:4], predictor.http, "llm", concurrency=2)
    assert len(probs) == 4
    assert all(0.0 <= p <= 1.0 for p in probs)
    again = await judge_probabilities(PAIRS[:1], predictor.http, "llm", concurrency=1)
    assert again[0] == probs[0]  # temperature 0, one prefill: the same answer for the same pair


def test_calibrate_judge_command(predictor: Predictor, tmp_path: Path) -> None:
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text(
        "".join(
            json.dumps({"a": p.a, "b": p.b, "same_answer": p.same_answer, "category": p.category}) + "\n"
            for p in PAIRS
        ),
        encoding="utf-8",
    )
    out = tmp_path / "judge.json"
    run = subprocess.run(
        [sys.executable, "-m", "semserve", "cache", "calibrate-judge", "--predictor-url", predictor.http,
         "--calib", str(pairs_file), "--out", str(out), "--concurrency", "4"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["pairs"] == 30 and doc["model"] == "llm"
    assert len(doc["holdout"]) == 2 and doc["scorer_lowered_served_rate"] >= doc["scorer_served_rate"]
    v = verdicts(PAIRS, 0.01, 0.65)
    assert doc["grey_pairs_judged"] == int((v.grey & (v.score >= min(MIN_SCORES))).sum())
    assert doc["wrong_rate"] <= doc["max_wrong_rate"]
    assert doc["served_rate"] >= doc["scorer_served_rate"]
    same = np.array([p.same_answer for p in PAIRS])
    assert doc["scorer_served_rate"] == (v.served & same).sum() / same.sum()
    holds = all(c["gain_over_lower_threshold"] > 0 and c["wrong_rate"] <= doc["max_wrong_rate"]
                for c in doc["holdout"])
    if doc["min_score"] is None or not holds:
        assert "leave --cache-judge off" in doc["advice"]
    else:
        assert doc["advice"].startswith("--cache-judge predictor")
