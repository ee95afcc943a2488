"""RuleVerifier: may the answer cached for `candidate` be served for `query`?

Two modes (VerifierSettings.mode). "scorer", the default: the rules below become features of a
learned pair scorer (cache.pairfeatures, cache.scorer), which decides at the threshold the error
budget (CacheSettings.max_wrong_rate) picks from its calibration curve; `hard_rules` still veto on
their own, and text that is not English fails closed (cache.language). "rules": the rules alone,
as described here (the rules themselves: cache/verify/rules.py).

Embedding cosine alone serves wrong answers on look-alike prompts ("cancel" vs "don't cancel",
"Paris to Rome" vs "Rome to Paris", "3 tablets" vs "30 tablets", "all users" vs "admin users",
"increase" vs "decrease", "how" vs "why"). So after a similarity floor, cheap, explainable rules run on
both texts (cache/verify/rules.py), in this order (the first one that decides names itself in the Verdict):

  exact         identical after normalization (case, punctuation, whitespace, contractions) -> accept
  below_floor   cosine under CacheSettings.min_similarity -> reject
  negation      different count of negations (not/no/never/without/n't/unable/-free...) -> veto
  number        numbers (digits, number words, ordinals, "dozen") or their units differ -> veto
  date          weekdays, months, years-as-words, today/tomorrow, next/last week, seasons differ -> veto
  question      incompatible question types (why vs how vs when vs where vs who vs how-much, or
                yes/no vs a specific wh-question) -> veto
  antonym       a word on one side and its opposite on the other (lexicon + un-/dis-/in-/de- prefixes,
                in/ex, up/down, over/under swaps) -> veto
  direction     two shared words swap around a shared pivot (from X to Y, X owes Y, X than Y) or a word
                changes role (from -> to) -> veto
  content       remaining content words (stopwords and request framing removed, light stemming, a
                synonym list, typo and split-word matching) that have no counterpart on the other side:
                  none           accept if cosine >= accept_clean
                  one side only  (narrower/wider scope) accept if few, none a proper noun or code,
                                 and cosine >= accept_added
                  both sides     (a substituted word) accept only if cosine >= accept_substituted

Everything is pure Python on short strings; the per-text analysis (cache.verify.analysis) is memoized,
so a check costs tens of microseconds. Rules can be switched off one by one (`disabled_rules`) for ablations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cache.interfaces import Verdict
from cache.language import is_english
from cache.settings import RULES, CacheSettings, VerifierSettings
from cache.verify import lexicon as lex
from cache.verify.analysis import analyze
from cache.verify.rules import GUARDS, content_diff
from semserve.logs import get_logger

if TYPE_CHECKING:
    from cache.scorer import PairScorer

log = get_logger("semserve.cache.verify")


# The detail of a verdict a hard rule decided starts with this (`probability` looks for it).
_HARD = "hard rule: "


class RuleVerifier:
    """Implements the cache's Verifier protocol: in scorer mode (the default) the learned pair
    scorer of cache.scorer decides, at the threshold that the wrong-serve budget picks from its
    calibration curve; in rules mode, the rules described in the module docstring.

    Before either: identical after normalization accepts, and a text the scorer cannot judge (not
    English) rejects, so a language the features were not built for can never be served wrongly.
    """

    def __init__(
        self,
        settings: VerifierSettings | None = None,
        *,
        max_wrong_rate: float | None = None,
        min_similarity: float | None = None,
        scorer: PairScorer | None = None,
    ) -> None:
        """`max_wrong_rate` and `min_similarity` are cache settings (CacheSettings, their one
        owner); unset, they are read from its environment variables."""
        self.settings = settings or VerifierSettings.from_env()
        if min_similarity is None:
            min_similarity = CacheSettings.from_env().min_similarity
        self.min_similarity = min_similarity
        self.disabled = frozenset(r.strip() for r in self.settings.disabled_rules.split(",") if r.strip())
        unknown = self.disabled - set(RULES)
        if unknown:
            raise ValueError(f"SEMSERVE_VERIFY_DISABLED_RULES: unknown rules {sorted(unknown)}; know {RULES}")
        if self.settings.mode not in ("scorer", "rules"):
            raise ValueError(f"SEMSERVE_VERIFY_MODE: {self.settings.mode!r}, expected scorer or rules")
        self.hard = frozenset(r.strip() for r in self.settings.hard_rules.split(",") if r.strip())
        if self.hard - set(RULES[:-1]):
            raise ValueError(f"SEMSERVE_VERIFY_HARD_RULES: unknown rules {sorted(self.hard - set(RULES))}")
        self.scorer: PairScorer | None = None
        self.threshold = 1.01
        if self.settings.mode == "scorer":
            from cache.scorer import default_scorer

            # Loaded at start, not on the first request: a missing or stale file fails the start.
            self.scorer = scorer or default_scorer(str(self.settings.scorer_path or ""))
            if max_wrong_rate is None:
                max_wrong_rate = CacheSettings.from_env().max_wrong_rate
            self.use_max_wrong_rate(max_wrong_rate)

    def use_max_wrong_rate(self, max_wrong_rate: float) -> None:
        """Move the operating point to the calibrated threshold for this wrong-serve budget."""
        if not 0.0 <= max_wrong_rate <= 1.0:
            raise ValueError(f"max wrong rate {max_wrong_rate} is not in [0, 1]")
        self.max_wrong_rate = max_wrong_rate
        if self.scorer is not None:
            point = self.scorer.threshold_for(max_wrong_rate)
            self.threshold = point.threshold
            log.info(
                "verify_operating_point",
                max_wrong_rate=max_wrong_rate,
                threshold=round(point.threshold, 4),
                calib_wrong_rate=point.wrong_rate,
                calib_served_rate=point.served_rate,
            )

    def check(self, query: str, candidate: str, similarity: float) -> Verdict:
        verdict = self._decide(query, candidate, similarity)
        log.debug(
            "verify_decision",
            accept=verdict.accept,
            rule=verdict.rule,
            score=round(verdict.score, 4),
            # `detail` names the differing words, i.e. prompt content: logs carry none of it.
        )
        return verdict

    def _decide(self, query: str, candidate: str, similarity: float) -> Verdict:
        s = self.settings
        a, b = analyze(query), analyze(candidate)
        if not a.norm or not b.norm:
            return Verdict(False, "empty", similarity, "nothing to compare after normalization")
        if a.norm == b.norm:
            return Verdict(True, "exact", similarity, "identical after normalization")
        if not (is_english(query) and is_english(candidate)):
            # The lexicons and the scorer's features are English: on other text they cannot tell a
            # paraphrase from a look-alike, so only identical prompts (above) are served.
            return Verdict(False, "unsupported_language", similarity, "not English: only exact repeats")
        if similarity < self.min_similarity:
            floor = self.min_similarity
            return Verdict(False, "below_floor", similarity, f"cosine {similarity:.3f} < {floor}")
        if self.scorer is not None:
            return self._score(query, candidate, similarity)
        for name, rule in GUARDS:
            if name in self.disabled:
                continue
            why = rule(a, b)
            if why is not None:
                return Verdict(False, name, similarity, why)
        if "content" in self.disabled:
            ok = similarity >= s.accept_clean
            return Verdict(ok, "similarity", similarity, f"cosine {similarity:.3f} vs {s.accept_clean}")
        diff = content_diff(a, b)
        if not diff.only_a and not diff.only_b:
            ok = similarity >= s.accept_clean
            return Verdict(
                ok,
                "content_clean",
                similarity,
                f"all content words matched; cosine {similarity:.3f} vs {s.accept_clean}",
            )
        detail = f"unmatched {list(diff.only_a)} vs {list(diff.only_b)}"
        if diff.only_a and diff.only_b:
            n = max(len(diff.only_a), len(diff.only_b))
            ok = not diff.specific and n <= s.max_substituted and similarity >= s.accept_substituted
            return Verdict(
                ok,
                "content_substituted",
                similarity,
                f"{detail}; cosine {similarity:.3f} vs {s.accept_substituted}",
            )
        # Extra words joined by a conjunction only one side has ("horizontally and vertically",
        # "... but keep the changes") add a requirement: a wider question, never the same one.
        extra = (a.words - b.words) if diff.only_a else (b.words - a.words)
        conj = sorted(set(extra) & lex.CONJUNCTIONS)
        if conj:
            return Verdict(False, "content_added", similarity, f"{detail}; added clause with {conj[0]!r}")
        n = len(diff.only_a) + len(diff.only_b)
        ok = not diff.specific and n <= s.max_added and similarity >= s.accept_added
        return Verdict(
            ok, "content_added", similarity, f"{detail}; cosine {similarity:.3f} vs {s.accept_added}"
        )

    def probability(self, query: str, candidate: str, similarity: float) -> float:
        """The number `check` compares with the threshold in scorer mode: 1 for identical prompts,
        0 where a check before the scorer rejects (language, floor, hard rule), else the scorer's
        probability. For curves over all thresholds (`semserve cache eval --plot`)."""
        v = self._decide(query, candidate, similarity)
        if v.rule == "exact":
            return 1.0
        if self.scorer is None or v.rule in ("empty", "unsupported_language", "below_floor"):
            return 0.0
        if v.detail.startswith(_HARD):
            return 0.0
        return v.score

    def _score(self, query: str, candidate: str, similarity: float) -> Verdict:
        # Here, not at the top: cache.pairfeatures imports cache.verify (this package) on its own.
        from cache.pairfeatures import pair_features

        assert self.scorer is not None
        x, vetoes = pair_features(query, candidate, similarity)
        objecting = [v for v in vetoes if v.removeprefix("rule_") not in self.disabled]
        for name in objecting:
            rule = name.removeprefix("rule_")
            if rule in self.hard:
                return Verdict(False, rule, similarity, f"{_HARD}{vetoes[name]}")
        p = self.scorer.probability(x)
        detail = f"score {p:.3f} vs {self.threshold:.3f} (cosine {similarity:.3f})"
        if p >= self.threshold:
            return Verdict(True, "scorer", p, detail)
        # Rejected: name the rule that objected, if any (the likeliest reason), else the score.
        if objecting:
            rule = objecting[0].removeprefix("rule_")
            return Verdict(False, rule, p, f"{detail}; {vetoes[objecting[0]]}")
        return Verdict(False, "scorer", p, detail)
