"""`semserve cache calibrate-judge`: choose the same-answer judge's grey zone and threshold for one
deployment's own predictor, on labelled pairs, within the wrong-serve budget.

    semserve cache calibrate-judge --predictor-url http://HOST:PORT [--model NAME] [--calib FILE ...]
                                   [--cache-max-wrong-rate F] [--concurrency N] [--out PATH]

Every pair goes through the verifier exactly as a lookup does (cache.verify.RuleVerifier at the budget's
operating point). The pairs the scorer turns down by score alone (rule `scorer`, the only ones the
transformer's judge step asks about) are sent to the predictor's judge model over KServe v2 REST. The
command then picks the `--cache-judge-min-score` and `--cache-judge-threshold` that serve the most
same-answer pairs while the look-alikes served, scorer and judge together, stay within the budget, and
says when no choice adds anything (then leave `--cache-judge off`). A choice counts only if it holds
on held-out intents: chosen on one half of the pairs' intents, it must serve more than the scorer with
its threshold lowered to the same budget on the other half, within the budget, both ways round. The
judge's answers depend on the predictor's model: calibrate on the model the deployment serves, never
copy another's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.settings import CacheSettings
from semserve.judge_protocol import CACHED_INPUT, PROBABILITY_OUTPUT, QUERY_INPUT, judge_model_name
from semserve.tooling.cache_eval import Pair, load_pairs, pair_similarities
from semserve.tooling.pair_generation import SPLIT_FILES

# Grey-zone floors tried: scorer probabilities under the serving threshold worth a second opinion.
MIN_SCORES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass(frozen=True)
class JudgeChoice:
    min_score: float | None  # None: no choice adds a served pair within the budget
    threshold: float | None
    served_rate: float  # same-answer pairs served, scorer and judge together
    wrong_rate: float  # look-alikes served, scorer and judge together
    scorer_served_rate: float  # the scorer alone at the same budget
    scorer_wrong_rate: float
    judge_calls: int  # grey pairs at the chosen floor (the judge's load per such lookup)


@dataclass(frozen=True)
class PairVerdicts:
    same: np.ndarray  # labels
    served: np.ndarray  # served by the verifier alone (exact repeat or scorer)
    grey: np.ndarray  # turned down by the scorer's score alone: the judge step may ask
    score: np.ndarray  # the scorer's probability (0 where it did not judge)


def verdicts(pairs: Sequence[Pair], max_wrong_rate: float, min_similarity: float) -> PairVerdicts:
    from cache.embedder import Embedder
    from cache.verify import RuleVerifier

    verifier = RuleVerifier(max_wrong_rate=max_wrong_rate, min_similarity=min_similarity)
    sims = pair_similarities(pairs, Embedder())
    served, grey, score = [], [], []
    for p, s in zip(pairs, sims, strict=True):
        v = verifier.check(p.b, p.a, float(s))  # b is the new query, a the cached prompt
        served.append(v.accept)
        grey.append(not v.accept and v.rule == "scorer")
        score.append(v.score if v.rule == "scorer" else 0.0)
    return PairVerdicts(
        np.array([p.same_answer for p in pairs], dtype=bool),
        np.array(served, dtype=bool),
        np.array(grey, dtype=bool),
        np.array(score, dtype=np.float64),
    )


async def judge_probabilities(
    pairs: Sequence[Pair], url: str, model: str, concurrency: int, timeout_s: float = 60.0,
    client: Any = None,
) -> list[float]:
    """P(same answer) from the predictor's judge model for each pair, over KServe v2 REST (on
    `client`, an httpx.AsyncClient, when given)."""
    import httpx

    endpoint = f"{url.rstrip('/')}/v2/models/{judge_model_name(model)}/infer"
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, p: Pair) -> float:
        body = {
            "inputs": [
                {"name": QUERY_INPUT, "datatype": "BYTES", "shape": [1], "data": [p.b]},
                {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1], "data": [p.a]},
            ]
        }
        async with gate:
            r = await client.post(endpoint, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"{endpoint}: HTTP {r.status_code}: {r.text[:200]}")
        for out in r.json()["outputs"]:
            if out["name"] == PROBABILITY_OUTPUT:
                return float(out["data"][0])
        raise RuntimeError(f"{endpoint}: no {PROBABILITY_OUTPUT} output")

    if client is not None:
        return list(await asyncio.gather(*(one(client, p) for p in pairs)))
    async with httpx.AsyncClient(timeout=timeout_s) as own:
        return list(await asyncio.gather(*(one(own, p) for p in pairs)))


def _rates(v: PairVerdicts, serve: np.ndarray, among: np.ndarray) -> tuple[float, float]:
    """(same-answer pairs served, look-alikes served) among these pairs."""
    n_same, n_diff = max(1, int((v.same & among).sum())), max(1, int((~v.same & among).sum()))
    return float((serve & v.same & among).sum() / n_same), float((serve & ~v.same & among).sum() / n_diff)


def serves(v: PairVerdicts, judged: np.ndarray, choice: JudgeChoice) -> np.ndarray:
    """Which pairs the verifier and the judge at this choice serve together."""
    if choice.min_score is None or choice.threshold is None:
        return v.served
    asked = v.grey & (v.score >= choice.min_score)
    return v.served | (asked & (np.nan_to_num(judged, nan=-1.0) >= choice.threshold))


def choose(
    v: PairVerdicts, judged: np.ndarray, max_wrong_rate: float, among: np.ndarray | None = None
) -> JudgeChoice:
    """The (floor, threshold) serving the most same-answer pairs (of `among`, default all) within the
    budget; `judged` holds the judge's probability for grey pairs (NaN elsewhere). Ties go to fewer
    wrong serves, then to the higher floor (fewer judge calls) and the higher threshold."""
    among = np.ones(len(v.same), dtype=bool) if among is None else among

    def rates(serve: np.ndarray) -> tuple[float, float]:
        return _rates(v, serve, among)

    base_served, base_wrong = rates(v.served)
    best = JudgeChoice(None, None, base_served, base_wrong, base_served, base_wrong, 0)
    probs = np.nan_to_num(judged, nan=-1.0)
    for floor in sorted(MIN_SCORES, reverse=True):
        asked = v.grey & (v.score >= floor)
        for t in np.unique(probs[asked & among])[::-1]:
            served, wrong = rates(v.served | (asked & (probs >= t)))
            if wrong <= max_wrong_rate and (served, -wrong) > (best.served_rate, -best.wrong_rate):
                best = JudgeChoice(
                    floor, float(t), served, wrong, base_served, base_wrong, int((asked & among).sum())
                )
    return best


def lower_scorer_threshold(
    v: PairVerdicts, max_wrong_rate: float, among: np.ndarray | None = None
) -> JudgeChoice:
    """No judge: the scorer alone with its threshold lowered as far as the budget allows (every grey
    score is a candidate threshold; `min_score` holds the chosen one). What spare budget buys anyway."""
    among = np.ones(len(v.same), dtype=bool) if among is None else among
    base_served, base_wrong = _rates(v, v.served, among)
    best = JudgeChoice(None, None, base_served, base_wrong, base_served, base_wrong, 0)
    for t in np.unique(v.score[v.grey & among])[::-1]:
        served, wrong = _rates(v, v.served | (v.grey & (v.score >= t)), among)
        if wrong <= max_wrong_rate and (served, -wrong) > (best.served_rate, -best.wrong_rate):
            best = JudgeChoice(float(t), 0.0, served, wrong, base_served, base_wrong, 0)
    return best


@dataclass(frozen=True)
class HoldoutCheck:
    """A choice made on one half of the intents, read on the other half."""

    served_gain: float  # same-answer pairs served beyond the scorer alone (as deployed)
    gain_over_lower_threshold: float  # beyond the scorer with its threshold lowered to the budget
    wrong_rate: float  # look-alikes served, scorer and judge together


def intent_halves(pairs: Sequence[Pair]) -> np.ndarray:
    """0/1 per pair: the connected components of the prompt graph (about one per intent: its
    paraphrases and look-alikes share prompts), dealt alternately into two halves."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for p in pairs:
        parent[find(p.a)] = find(p.b)
    roots = sorted({find(p.a) for p in pairs})
    half = {r: i % 2 for i, r in enumerate(roots)}
    return np.array([half[find(p.a)] for p in pairs], dtype=np.int8)


def holdout_checks(
    v: PairVerdicts, judged: np.ndarray, max_wrong_rate: float, halves: np.ndarray
) -> list[HoldoutCheck]:
    """Choose on each half, read on the other. A judge that tells nothing apart still finds some
    threshold that fits one half's noise; only a gain that holds on unseen intents is real. The
    comparison includes the scorer alone at a lower threshold (a judge that answers yes to every
    grey pair), which is what spare budget buys without any judge."""
    always_yes = np.where(v.grey, 1.0, np.nan)
    checks = []
    for h in (0, 1):
        fit, other = halves == h, halves != h
        with_judge = _rates(v, serves(v, judged, choose(v, judged, max_wrong_rate, fit)), other)
        # A judge that says yes to every grey pair at or above the chosen score: the lowered scorer.
        lowered = _rates(v, serves(v, always_yes, lower_scorer_threshold(v, max_wrong_rate, fit)), other)
        alone = _rates(v, v.served, other)
        checks.append(HoldoutCheck(with_judge[0] - alone[0], with_judge[0] - lowered[0], with_judge[1]))
    return checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from semserve.config import ServerSettings

    parser.add_argument(
        "--predictor-url", required=True, help="the predictor's HTTP base URL (KServe v2 REST)"
    )
    parser.add_argument("--model", default=ServerSettings().model_name, help="the predictor's model name")
    parser.add_argument("--calib", type=Path, action="append", default=None, help="labelled pairs (JSONL)")
    parser.add_argument("--concurrency", type=int, default=8, help="judge requests in flight")
    parser.add_argument("--out", type=Path, default=None, help="also write the result here (JSON)")
    CacheSettings.add_arguments(parser, flag_prefix="cache-", only=("max_wrong_rate", "min_similarity"))


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    settings = CacheSettings.from_namespace(args, flag_prefix="cache-")
    pairs = [p for f in (args.calib or [SPLIT_FILES["calib"]]) for p in load_pairs(f)]
    v = verdicts(pairs, settings.max_wrong_rate, settings.min_similarity)
    asked = v.grey & (v.score >= min(MIN_SCORES))
    idx = np.flatnonzero(asked)
    probs = asyncio.run(
        judge_probabilities([pairs[i] for i in idx], args.predictor_url, args.model, args.concurrency)
    )
    judged = np.full(len(pairs), np.nan)
    judged[idx] = probs
    budget = settings.max_wrong_rate
    choice = choose(v, judged, budget)
    lowered = lower_scorer_threshold(v, budget)
    checks = holdout_checks(v, judged, budget, intent_halves(pairs))
    holds = all(c.gain_over_lower_threshold > 0 and c.wrong_rate <= budget for c in checks)
    if choice.min_score is None or choice.threshold is None:
        advice = "the judge adds no served pair within the budget on these pairs: leave --cache-judge off"
    elif not holds:
        advice = (
            "the judge's gain does not hold on held-out intents (or no more than lowering the scorer's "
            "threshold): leave --cache-judge off"
        )
    else:
        advice = (
            f"--cache-judge predictor --cache-judge-min-score {choice.min_score} "
            f"--cache-judge-threshold {choice.threshold:.4f}"
        )
    doc = {
        **asdict(choice),
        # The scorer alone with its threshold lowered to spend the same budget (no judge).
        "scorer_lowered_served_rate": lowered.served_rate,
        "scorer_lowered_wrong_rate": lowered.wrong_rate,
        "holdout": [asdict(c) for c in checks],
        "model": args.model,
        "max_wrong_rate": budget,
        "pairs": len(pairs),
        "grey_pairs_judged": len(idx),
        "advice": advice,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    text = json.dumps(doc, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semserve.tooling.judge_calibration", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
