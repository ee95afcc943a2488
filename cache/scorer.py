"""The learned pair scorer: P(same answer | query, cached prompt) from cache.pairfeatures, and the
operating point that keeps wrong serves under a user-set budget.

The model is a small gradient-boosted tree ensemble (scikit-learn's HistGradientBoosting, trained by
`semserve cache train`), shipped as plain JSON in cache/data/scorer.json: no pickle (loading it
runs no code), no scikit-learn at run time, a few hundred microseconds per candidate in pure Python.

The same file carries the calibration curve measured on the calibration split (never the test
split): for each threshold, the share of look-alikes served and of same-answer pairs served.
`threshold_for(max_wrong_rate)` picks the lowest threshold whose wrong-serve rate on calibration is
within the budget, so `--cache-max-wrong-rate` moves the operating point without retraining.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from cache.pairfeatures import FEATURE_NAMES

# The scorer file and the labelled pairs it was trained and calibrated on (semserve/tooling/).
DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_MODEL_PATH = DATA_DIR / "scorer.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CalibrationPoint:
    threshold: float
    wrong_rate: float  # look-alikes served / look-alikes, on the calibration split
    served_rate: float  # same-answer pairs served / same-answer pairs


class _Forest:
    """All trees as padded 2-D arrays, walked together level by level: one numpy step per depth
    level instead of one Python step per node (about 10x faster for 100 trees)."""

    def __init__(self, trees: list[dict[str, list[Any]]]) -> None:
        n = max((len(t["leaf"]) for t in trees), default=1)
        k = len(trees)
        self.feature = np.zeros((k, n), dtype=np.intp)
        self.threshold = np.zeros((k, n), dtype=np.float64)
        self.left = np.zeros((k, n), dtype=np.intp)
        self.right = np.zeros((k, n), dtype=np.intp)
        self.value = np.zeros((k, n), dtype=np.float64)
        depth = 0
        for i, t in enumerate(trees):
            m = len(t["leaf"])
            leaf = np.asarray(t["leaf"], dtype=bool)
            idx = np.arange(m)
            self.feature[i, :m] = t["feature"]
            self.threshold[i, :m] = t["threshold"]
            # A leaf points at itself, so extra levels leave finished trees where they are.
            self.left[i, :m] = np.where(leaf, idx, t["left"])
            self.right[i, :m] = np.where(leaf, idx, t["right"])
            self.value[i, :m] = t["value"]
            depth = max(depth, _depth(t))
        self.depth = depth
        self.rows = np.arange(k)

    def predict(self, x: np.ndarray) -> float:
        node = np.zeros(len(self.rows), dtype=np.intp)
        for _ in range(self.depth):
            f = self.feature[self.rows, node]
            go_left = x[f] <= self.threshold[self.rows, node]
            node = np.where(go_left, self.left[self.rows, node], self.right[self.rows, node])
        return float(self.value[self.rows, node].sum())


def _depth(tree: dict[str, list[Any]]) -> int:
    best, stack = 0, [(0, 0)]
    while stack:
        i, d = stack.pop()
        if tree["leaf"][i]:
            best = max(best, d)
        else:
            stack += [(tree["left"][i], d + 1), (tree["right"][i], d + 1)]
    return best


class PairScorer:
    """A trained scorer file: features in, probability out, plus its calibration curve."""

    def __init__(self, doc: dict[str, Any], source: str = "<memory>") -> None:
        if doc.get("format") != FORMAT_VERSION:
            raise ValueError(f"{source}: scorer format {doc.get('format')!r}, expected {FORMAT_VERSION}")
        if tuple(doc["features"]) != FEATURE_NAMES:
            # Features changed in code since the file was trained: its numbers would be garbage.
            raise ValueError(f"{source}: trained on other features; run `semserve cache train`")
        self.source = source
        self.meta: dict[str, Any] = doc.get("meta", {})
        self.baseline = float(doc["baseline"])
        self.forest = _Forest(doc["trees"])
        self.n_trees = len(doc["trees"])
        self.calibration = [CalibrationPoint(**p) for p in doc.get("calibration", [])]
        self.importances: dict[str, float] = doc.get("importances", {})

    @classmethod
    def load(cls, path: Path | str | None = None) -> PairScorer:
        p = Path(path) if path else DEFAULT_MODEL_PATH
        return cls(json.loads(p.read_text(encoding="utf-8")), str(p))

    def raw(self, x: Sequence[float] | np.ndarray) -> float:
        return self.baseline + self.forest.predict(np.asarray(x, dtype=np.float64))

    def probability(self, x: Sequence[float] | np.ndarray) -> float:
        z = self.raw(x)
        return 1.0 / (1.0 + math.exp(-z)) if z > -500 else 0.0

    def probabilities(self, xs: np.ndarray) -> np.ndarray:
        return np.array([self.probability(x) for x in xs])

    def threshold_for(self, max_wrong_rate: float) -> CalibrationPoint:
        """The operating point: the most permissive calibrated threshold within the budget.

        With no point within the budget (a budget under what calibration can show), the strictest
        point is used, and a probability can never exceed 1, so nothing but exact repeats is served.
        """
        if not self.calibration:
            raise ValueError(f"{self.source}: no calibration curve; run `semserve cache train`")
        ok = [p for p in self.calibration if p.wrong_rate <= max_wrong_rate]
        if not ok:
            return CalibrationPoint(1.01, 0.0, 0.0)
        return min(ok, key=lambda p: p.threshold)


def calibration_curve(probs: np.ndarray, same: np.ndarray, steps: int = 200) -> list[CalibrationPoint]:
    """Wrong-serve and serve rates at thresholds spread over the observed scores (ascending)."""
    probs = np.asarray(probs, dtype=np.float64)
    same = np.asarray(same, dtype=bool)
    cands = np.unique(np.concatenate([np.quantile(probs, np.linspace(0, 1, steps)), probs[~same] + 1e-9]))
    out = []
    n_same, n_diff = max(1, int(same.sum())), max(1, int((~same).sum()))
    for t in cands:
        served = probs >= t
        out.append(
            CalibrationPoint(
                round(float(t), 9),
                round(float((served & ~same).sum() / n_diff), 6),
                round(float((served & same).sum() / n_same), 6),
            )
        )
    return out


def export_hgb(model: Any) -> dict[str, Any]:
    """A fitted sklearn HistGradientBoostingClassifier (binary) as the JSON this module loads."""
    trees = []
    for (pred,) in model._predictors:
        nodes = pred.nodes
        trees.append(
            {
                "feature": [int(v) for v in nodes["feature_idx"]],
                "threshold": [float(v) for v in nodes["num_threshold"]],
                "left": [int(v) for v in nodes["left"]],
                "right": [int(v) for v in nodes["right"]],
                "leaf": [bool(v) for v in nodes["is_leaf"]],
                "value": [round(float(v), 8) for v in nodes["value"]],
            }
        )
    return {"baseline": float(np.ravel(model._baseline_prediction)[0]), "trees": trees}


@lru_cache(maxsize=4)
def default_scorer(path: str = "") -> PairScorer:
    """The shipped (or configured) scorer, loaded once per process."""
    return PairScorer.load(path or None)
