"""Features of one (query, cached prompt) pair for the learned scorer (cache.scorer).

Kept apart from the model so training (semserve.tooling.scorer_training) and serving compute the
very same numbers. Every feature is cheap (the per-text analysis of cache.verify.analysis is
memoized) and general: counts, overlaps and the rules' verdicts, never a word identity, so the
model cannot memorize the vocabulary of its training pairs; the embedder's cosine carries the
meaning.

One place for the features: the verifier (cache.verify.verifier) and the scorer (cache.scorer) both
import this module, which imports neither, only the pure rules and analysis of cache.verify.
"""

from __future__ import annotations

from difflib import SequenceMatcher

import numpy as np

from cache.verify import lexicon
from cache.verify.analysis import Analysis, analyze
from cache.verify.rules import GUARDS, content_diff

FEATURE_NAMES: tuple[str, ...] = (
    "cosine",
    "cosine_sq",
    "rule_negation",
    "rule_number",
    "rule_date",
    "rule_question",
    "rule_antonym",
    "rule_direction",
    "negation_diff",
    "unmatched_query",
    "unmatched_cached",
    "unmatched_min",
    "unmatched_max",
    "unmatched_specific",
    "added_clause",
    "content_jaccard",
    "word_jaccard",
    "char3_jaccard",
    "content_len_ratio",
    "content_len_max",
    "same_first_wh",
    "near_dup",
    "clean",
    "cosine_if_clean",
    "substituted",
    "rules_firing",
    "cosine_if_rule",
    "how_measure_diff",
    "qtype_jaccard",
    "typo_only",
)

# The verifier's guard rules, named as features: rule_negation, rule_number, ...
_RULES = tuple((f"rule_{name}", rule) for name, rule in GUARDS)
_WH = ("what", "why", "how", "when", "where", "who", "which", "can", "is", "do", "does", "should")


def _jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _trigrams(norm: str) -> set[str]:
    s = f"  {norm} "
    return {s[i : i + 3] for i in range(len(s) - 2)}


def _first_wh(x: Analysis) -> str:
    for t in x.tokens:
        if t.text in _WH:
            return t.text
    return ""


def _how_measure(x: Analysis) -> set[str]:
    """The measure a "how X" question asks for: much, many, long, far, often, ..."""
    toks = [t.text for t in x.tokens]
    return {toks[i + 1] for i, w in enumerate(toks[:-1]) if w == "how" and toks[i + 1] in lexicon.HOW_MEASURE}


def _rule_vetoes(a: Analysis, b: Analysis) -> dict[str, str]:
    """Each guard rule of cache.verify.rules that objects, with its reason."""
    out = {}
    for name, rule in _RULES:
        why = rule(a, b)
        if why is not None:
            out[name] = why
    return out


def pair_features(query: str, cached: str, similarity: float) -> tuple[np.ndarray, dict[str, str]]:
    """The feature vector (FEATURE_NAMES order) and the rules that object (name -> reason)."""
    a, b = analyze(query), analyze(cached)
    vetoes = _rule_vetoes(a, b)
    diff = content_diff(a, b)
    ca = {t.stem for t in a.tokens if t.content}
    cb = {t.stem for t in b.tokens if t.content}
    wa = {t.stem for t in a.tokens if t.text != "|"}
    wb = {t.stem for t in b.tokens if t.text != "|"}
    extra = (a.words - b.words) if diff.only_a else (b.words - a.words)
    added_clause = bool(set(extra) & lexicon.CONJUNCTIONS) and not (diff.only_a and diff.only_b)
    na, nb = len(diff.only_a), len(diff.only_b)
    la, lb = len(ca), len(cb)
    f = {
        "cosine": similarity,
        "cosine_sq": similarity * similarity,
        "negation_diff": float(abs(a.negations - b.negations)),
        "unmatched_query": float(na),
        "unmatched_cached": float(nb),
        "unmatched_min": float(min(na, nb)),
        "unmatched_max": float(max(na, nb)),
        "unmatched_specific": float(len(diff.specific)),
        "added_clause": float(added_clause),
        "content_jaccard": _jaccard(ca, cb),
        "word_jaccard": _jaccard(wa, wb),
        "char3_jaccard": _jaccard(_trigrams(a.norm), _trigrams(b.norm)),
        "content_len_ratio": min(la, lb) / max(1, la, lb),
        "content_len_max": float(max(la, lb)),
        "same_first_wh": float(_first_wh(a) == _first_wh(b)),
        # Typed again with noise: the same characters in the same order, whatever the embedder says.
        "near_dup": SequenceMatcher(None, a.norm, b.norm, autojunk=False).ratio(),
        "clean": float(na == 0 and nb == 0),
        "cosine_if_clean": similarity if na == 0 and nb == 0 else 0.0,
        "substituted": float(na > 0 and nb > 0),
        "rules_firing": float(len(vetoes)),
        "cosine_if_rule": similarity if vetoes else 0.0,
        # "how much" vs "how long" about the same thing: one word apart, another answer.
        "how_measure_diff": float(bool(_how_measure(a) ^ _how_measure(b))),
        "qtype_jaccard": _jaccard(set(a.qtypes), set(b.qtypes)),
    }
    # Every word has its counterpart and the characters barely differ: a typo, a case or punctuation
    # change. The embedder's cosine collapses on misspelt words ("ntoice" -> 0.4), this does not.
    f["typo_only"] = float(f["clean"] and not vetoes and f["near_dup"] >= 0.85)
    for name, _rule in _RULES:
        f[name] = float(name in vetoes)
    return np.array([f[n] for n in FEATURE_NAMES], dtype=np.float64), vetoes
