"""`semserve cache train`: fit the pair scorer on the train split, calibrate it on the calibration
split, write cache/data/scorer.json. The test split is not read here (it is only for reporting).

    semserve cache train [--train FILE ...] [--calib FILE ...] [--out PATH]
                         [--cache-min-similarity F] [--hard-rules R,...] [--calibrate-only SCORER]

Reproducible: the pair files are deterministic (semserve.tooling.pair_generation), the embedder is
fixed and the boosting has a fixed random state, so the same inputs give the same file. A tenant
recalibrates on its own labelled pairs with `--calib their_pairs.jsonl` (and may add them to
training with `--train`); the README says how.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.language import is_english
from cache.pairfeatures import FEATURE_NAMES, pair_features
from cache.scorer import DEFAULT_MODEL_PATH, FORMAT_VERSION, calibration_curve, export_hgb
from cache.settings import CacheSettings, VerifierSettings
from cache.verify.analysis import analyze
from semserve.tooling.cache_eval import Pair, load_pairs, pair_similarities
from semserve.tooling.pair_generation import SPLIT_FILES

# Small on purpose: a few thousand pairs, ~30 features. Chosen on the calibration split (served
# share at 1 % wrong) among 48 settings (rounds 100/300, 7/15/31 leaves, min leaf 10/40, learning rate
# 0.05/0.1, with and without monotonic constraints): shallow trees and few rounds generalize best;
# monotonic constraints cost 5-10 points of hits. The test split played no part in the choice.
HGB_PARAMS: dict[str, Any] = {
    "max_iter": 100,
    "learning_rate": 0.05,
    "max_leaf_nodes": 7,
    "min_samples_leaf": 10,
    "l2_regularization": 1.0,
    "random_state": 0,
}


@dataclass(frozen=True)
class PairRows:
    """Features of labelled pairs and what the verifier does before the scorer is asked."""

    x: np.ndarray  # rows in FEATURE_NAMES order
    same: np.ndarray  # labels
    exact: np.ndarray  # identical after normalization: served without the scorer
    judged: np.ndarray  # the scorer decides (English, cosine >= floor, no hard rule objects)


def feature_matrix(pairs: Sequence[Pair], similarities: np.ndarray) -> np.ndarray:
    """Rows in FEATURE_NAMES order; b is the new query, a the cached prompt (as in the cache)."""
    return np.array([pair_features(p.b, p.a, float(s))[0] for p, s in zip(pairs, similarities, strict=True)])


def pair_rows(
    pairs: Sequence[Pair], similarities: np.ndarray, min_similarity: float, hard_rules: frozenset[str]
) -> PairRows:
    """The rows, and which of them reach the scorer in cache.verify.RuleVerifier's order."""
    rows, exact, judged = [], [], []
    for p, s in zip(pairs, similarities, strict=True):
        x, vetoes = pair_features(p.b, p.a, float(s))
        rows.append(x)
        same_text = analyze(p.a).norm == analyze(p.b).norm
        hard = any(v.removeprefix("rule_") in hard_rules for v in vetoes)
        english = is_english(p.a) and is_english(p.b)
        exact.append(same_text)
        judged.append(not same_text and english and s >= min_similarity and not hard)
    width = len(FEATURE_NAMES)
    return PairRows(
        np.array(rows).reshape(-1, width),
        np.array([p.same_answer for p in pairs], dtype=bool),
        np.array(exact, dtype=bool),
        np.array(judged, dtype=bool),
    )


def _hard_rules(settings: VerifierSettings) -> frozenset[str]:
    return frozenset(r.strip() for r in settings.hard_rules.split(",") if r.strip())


def train(
    train_pairs: Sequence[Pair],
    calib_pairs: Sequence[Pair],
    embedder: Any,
    meta: dict[str, Any] | None = None,
    *,
    min_similarity: float | None = None,
    verifier_settings: VerifierSettings | None = None,
) -> dict[str, Any]:
    """Fit on the training pairs the scorer will judge, then calibrate (`calibrate`).

    Only pairs that reach the scorer at serving time train it: a pair under the similarity floor, one
    a hard rule vetoes or an exact repeat is decided before the scorer, and fitting those (mostly
    strongly reworded paraphrases under the floor) made the trees more cautious on the pairs they do
    judge (calibration split, 250-intent set: 44.8 vs 39.8 % served at 1 % wrong).
    """
    from sklearn.ensemble import HistGradientBoostingClassifier

    floor = CacheSettings().min_similarity if min_similarity is None else min_similarity
    hard = _hard_rules(verifier_settings or VerifierSettings())
    rt = pair_rows(train_pairs, pair_similarities(train_pairs, embedder), floor, hard)
    model = HistGradientBoostingClassifier(**HGB_PARAMS).fit(rt.x[rt.judged], rt.same[rt.judged])
    doc = {"format": FORMAT_VERSION, "features": list(FEATURE_NAMES), **export_hgb(model)}
    doc["meta"] = {
        **(meta or {}),
        "n_train": len(train_pairs),
        "n_train_judged": int(rt.judged.sum()),
        "params": HGB_PARAMS,
    }
    return calibrate(doc, calib_pairs, embedder, min_similarity=floor, verifier_settings=verifier_settings)


def calibrate(
    doc: dict[str, Any],
    calib_pairs: Sequence[Pair],
    embedder: Any,
    *,
    min_similarity: float | None = None,
    verifier_settings: VerifierSettings | None = None,
) -> dict[str, Any]:
    """`doc` (a scorer file's content) with a new calibration curve from these pairs.

    Each calibration pair is scored as the verifier decides it (exact repeat 1; under the floor,
    not English or vetoed by a hard rule 0; else the scorer), so the curve's wrong and served rates
    are the ones the cache shows at each threshold. Alone (`semserve cache train --calibrate-only`)
    it moves a scorer to another floor, other hard rules or a tenant's own labelled pairs without
    refitting the trees.
    """
    from cache.scorer import PairScorer

    floor = CacheSettings().min_similarity if min_similarity is None else min_similarity
    hard = _hard_rules(verifier_settings or VerifierSettings())
    scorer = PairScorer({**doc, "calibration": []})
    rc = pair_rows(calib_pairs, pair_similarities(calib_pairs, embedder), floor, hard)
    pc = np.where(rc.judged, scorer.probabilities(rc.x), 0.0)
    pc = np.where(rc.exact, 1.0, pc)
    meta = {
        **doc.get("meta", {}),
        "n_calib": len(calib_pairs),
        # The curve holds for this floor and these hard rules; others shift it (recalibrate).
        "min_similarity": floor,
        "hard_rules": sorted(hard),
    }
    return {**doc, "calibration": [asdict(p) for p in calibration_curve(pc, rc.same)], "meta": meta}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cache.embedder import EmbedderSettings

    parser.add_argument("--train", type=Path, action="append", default=None, help="training pairs (JSONL)")
    parser.add_argument("--calib", type=Path, action="append", default=None, help="calibration pairs (JSONL)")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_PATH, help="where to write the scorer")
    parser.add_argument(
        "--calibrate-only",
        type=Path,
        default=None,
        metavar="SCORER",
        help="keep this scorer file's trees and only redo its calibration curve (on --calib)",
    )
    # The floor and hard rules decide which pairs reach the scorer: it is fit and calibrated on those.
    CacheSettings.add_arguments(parser, flag_prefix="cache-", only=("min_similarity",))
    VerifierSettings.add_arguments(parser, only=("hard_rules",))
    EmbedderSettings.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from cache.embedder import Embedder, EmbedderSettings

    t0 = time.perf_counter()
    train_files = args.train or [SPLIT_FILES["train"]]
    calib_files = args.calib or [SPLIT_FILES["calib"]]
    train_pairs = [p for f in train_files for p in load_pairs(f)]
    calib_pairs = [p for f in calib_files for p in load_pairs(f)]
    embedder = Embedder(EmbedderSettings.from_namespace(args))
    meta = {
        "train_files": [Path(f).name for f in train_files],
        "calib_files": [Path(f).name for f in calib_files],
        "embedder": embedder.backend,
        # Which weights the cosines came from: a scorer fits the embedder it was trained with.
        "embedder_model": embedder.model_path.name,
    }
    path = {
        "min_similarity": CacheSettings.from_namespace(args, flag_prefix="cache-").min_similarity,
        "verifier_settings": VerifierSettings.from_namespace(args),
    }
    if args.calibrate_only is not None:
        base = json.loads(args.calibrate_only.read_text(encoding="utf-8"))
        # The trees' own training meta stays; the file says that only its curve is new.
        base["meta"] = {**base.get("meta", {}), "calib_files": meta["calib_files"], "recalibrated_only": True}
        doc = calibrate(base, calib_pairs, embedder, **path)
    else:
        doc = train(train_pairs, calib_pairs, embedder, meta, **path)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    print(
        json.dumps(
            {
                "out": str(args.out),
                "trees": len(doc["trees"]),
                "n_train": len(train_pairs),
                "n_calib": len(calib_pairs),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semserve.tooling.scorer_training", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
