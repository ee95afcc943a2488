"""Does the semantic cache serve the right answers? `semserve cache eval`, the command line of
the eval harness (semserve.tooling.cache_eval) on the labelled splits.

    semserve cache eval [--split test|calib|train|eval|tune ...] [--pairs FILE] [--json] [--plot PNG]
                        [--cache-max-wrong-rate R] [--mistakes]

Default splits: `test` (the held-out split of the project's pair set,
semserve/tooling/pair_generation.py; never used to choose anything) and `eval`
(cache/data/eval_pairs.jsonl, the older hand-written set). The tables put, on the same embeddings:
the verifier as configured (the learned scorer at the operating point
`--cache-max-wrong-rate` picks), the rules alone, plain cosine 0.80 (GPTCache's default) and cosine
0.90 (= RedisVL SemanticCache's default distance_threshold 0.1), overall and per category.
`--plot PATH` draws precision vs hit ratio for the scorer and plain cosine, the chosen point marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semserve.tooling.cache_eval import (
    BASELINE_THRESHOLDS,
    DEFAULT_SPLITS,
    GOAL_MAX_WRONG,
    GOAL_MIN_SERVED,
    SPLITS,
    evaluate_offline,
    evaluate_threshold,
    evaluate_through_private_redis,
    load_pairs,
    pair_similarities,
)
from semserve.tooling.cache_eval_report import format_categories, format_mistakes, format_reports


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cache.embedder import EmbedderSettings
    from cache.settings import CacheSettings
    from cache.verify import VerifierSettings

    parser.add_argument(
        "--split",
        choices=(*SPLITS, "both"),
        action="append",
        default=None,
        help=f"labelled split (repeatable; default: {' and '.join(DEFAULT_SPLITS)}; both = eval and tune)",
    )
    parser.add_argument("--pairs", type=Path, action="append", default=None, help="a JSONL file (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--per-category", action="store_true", help="(always on; kept for old scripts)")
    parser.add_argument("--mistakes", action="store_true", help="list the pairs the verifier got wrong")
    parser.add_argument("--outcomes", action="store_true", help="with --json: every pair's decision")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="write a precision vs hit ratio curve of the first split, the operating point marked",
    )
    parser.add_argument(
        "--knn-floor", type=float, default=None, help="KNN floor (default: --cache-min-similarity)"
    )
    parser.add_argument(
        "--through-cache",
        action="store_true",
        help="also run every pair through the real SemanticCache on a private, temporary Redis",
    )
    CacheSettings.add_arguments(parser, flag_prefix="cache-", only=("max_wrong_rate", "min_similarity"))
    EmbedderSettings.add_arguments(parser)
    VerifierSettings.add_arguments(parser)


def _files(args: argparse.Namespace) -> list[tuple[str, Path]]:
    if args.pairs:
        return [(p.stem, p) for p in args.pairs]
    names: list[str] = []
    for s in args.split or DEFAULT_SPLITS:
        for n in ("eval", "tune") if s == "both" else (s,):
            if n not in names:
                names.append(n)
    return [(n, SPLITS[n]) for n in names]


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from cache.embedder import Embedder, EmbedderSettings
    from cache.settings import CacheSettings
    from cache.verify import RuleVerifier, VerifierSettings

    cache_settings = CacheSettings.from_namespace(args, flag_prefix="cache-")
    verifier_settings = VerifierSettings.from_namespace(args)
    embedder = Embedder(EmbedderSettings.from_namespace(args))
    knn_floor = args.knn_floor if args.knn_floor is not None else cache_settings.min_similarity
    verifier = RuleVerifier(
        verifier_settings, max_wrong_rate=cache_settings.max_wrong_rate, min_similarity=knn_floor
    )
    rules_only = (
        RuleVerifier(dataclasses.replace(verifier_settings, mode="rules"), min_similarity=knn_floor)
        if verifier_settings.mode != "rules"
        else None
    )
    doc: dict[str, Any] = {
        "embedder_backend": embedder.backend,
        "mode": verifier_settings.mode,
        "max_wrong_rate": cache_settings.max_wrong_rate,
        "threshold": verifier.threshold if verifier.scorer is not None else None,
        "splits": {},
    }
    text: list[str] = []
    ok = True
    for n, (name, path) in enumerate(_files(args)):
        pairs = load_pairs(path)
        sims = pair_similarities(pairs, embedder)
        main = evaluate_offline(pairs, verifier=verifier, similarities=sims, knn_floor=knn_floor)
        reports = [main]
        if rules_only is not None:
            rules = evaluate_offline(pairs, verifier=rules_only, similarities=sims, knn_floor=knn_floor)
            reports.append(dataclasses.replace(rules, name="rules-only"))
        reports += [evaluate_threshold(pairs, sims, t) for t in BASELINE_THRESHOLDS]
        if args.through_cache:
            budget = cache_settings.max_wrong_rate
            reports.append(evaluate_through_private_redis(pairs, embedder, verifier, knn_floor, budget))
        ok = ok and main.meets_goal
        doc["splits"][name] = {r.name: r.as_dict(with_outcomes=args.outcomes and r is main) for r in reports}
        text.append(format_reports(f"{name}: {path.name} ({len(pairs)} pairs)", reports))
        text.append(format_categories(reports))
        if args.mistakes:
            text.append(format_mistakes(main))
        if args.plot is not None and n == 0 and verifier.scorer is not None:
            from semserve.tooling.cache_eval_plot import plot_curves

            scores = [
                verifier.probability(p.b, p.a, float(s)) if s >= knn_floor else 0.0
                for p, s in zip(pairs, sims, strict=True)
            ]
            plot_curves(
                args.plot,
                f"{name}: {path.name}",
                [p.same_answer for p in pairs],
                scores,
                [float(s) for s in sims],
                verifier.threshold,
                cache_settings.max_wrong_rate,
            )
            doc["plot"] = str(args.plot)
            text.append(f"  curve: {args.plot}")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        point = f"threshold {verifier.threshold:.3f} " if verifier.scorer is not None else ""
        print(
            f"embedder backend: {embedder.backend}; verifier: {verifier_settings.mode} {point}"
            f"(max wrong rate {cache_settings.max_wrong_rate:.1%}); goal: wrong_served <= "
            f"{GOAL_MAX_WRONG:.0%}, served_same >= {GOAL_MIN_SERVED:.0%}; cosine>=0.90 is RedisVL "
            f"SemanticCache's default (distance_threshold 0.1)"
        )
        print("\n\n".join(text))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semserve.tooling.cache_eval_cli", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
