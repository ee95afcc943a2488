"""The verifier's rules and RuleVerifier: may the answer cached for `candidate` be served for `query`?

Two modes (VerifierSettings.mode). "scorer", the default: the rules below become features of a
learned pair scorer (cache.pairfeatures, cache.scorer), which decides at the threshold the error
budget (CacheSettings.max_wrong_rate) picks from its calibration curve; `hard_rules` still veto on
their own, and text that is not English fails closed (cache.language). "rules": the rules alone,
as described here.

Embedding cosine alone serves wrong answers on look-alike prompts ("cancel" vs "don't cancel",
"Paris to Rome" vs "Rome to Paris", "3 tablets" vs "30 tablets", "all users" vs "admin users",
"increase" vs "decrease", "how" vs "why"). So after a similarity floor, cheap, explainable rules run on
both texts, in this order (the first one that decides names itself in the Verdict):

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

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cache.interfaces import Verdict
from cache.language import is_english
from cache.settings import RULES, CacheSettings, VerifierSettings
from cache.verify import lexicon as lex
from cache.verify.analysis import BOUNDARY, Analysis, Token, analyze, canon, is_typo, stem
from semserve.logs import get_logger

if TYPE_CHECKING:
    from cache.scorer import PairScorer

log = get_logger("semserve.cache.verify")


def rule_negation(a: Analysis, b: Analysis) -> str | None:
    if a.negations != b.negations:
        return f"negations {a.negations} vs {b.negations}"
    return None


def rule_number(a: Analysis, b: Analysis) -> str | None:
    def strong(x: Analysis) -> Counter[str]:
        return Counter(v for v, _u, weak in x.quantities if not weak)

    def every(x: Analysis) -> set[str]:
        return {v for v, _u, _w in x.quantities}

    sa, sb = strong(a), strong(b)
    missing_b = [v for v in sa if v not in every(b)]
    missing_a = [v for v in sb if v not in every(a)]
    if missing_a or missing_b:
        return f"numbers {sorted(every(a))} vs {sorted(every(b))}"
    units_a: dict[str, set[str]] = {}
    units_b: dict[str, set[str]] = {}
    for v, u, _w in a.quantities:
        if u:
            units_a.setdefault(v, set()).add(u)
    for v, u, _w in b.quantities:
        if u:
            units_b.setdefault(v, set()).add(u)
    for v in set(units_a) & set(units_b):
        ua, ub = units_a[v], units_b[v]
        # "100 degrees" vs "100°F": a bare degree is compatible with a scale.
        ua_cmp = {("deg" if x in ("degC", "degF") and "deg" in ub else x) for x in ua}
        ub_cmp = {("deg" if x in ("degC", "degF") and "deg" in ua else x) for x in ub}
        if not (ua_cmp & ub_cmp):
            return f"units of {v}: {sorted(ua)} vs {sorted(ub)}"
    if a.codes != b.codes:
        return f"codes {sorted(a.codes)} vs {sorted(b.codes)}"
    return None


def rule_date(a: Analysis, b: Analysis) -> str | None:
    if a.times != b.times:
        return f"times {sorted(a.times)} vs {sorted(b.times)}"
    return None


_SPECIFIC_Q = frozenset({"why", "how", "when", "where", "who", "how_much"})


def _qset(x: Analysis) -> frozenset[str]:
    q = set(x.qtypes)
    if "where_how" in q:
        q.discard("where_how")
        q.update(("where", "how"))
    return frozenset(q) & _SPECIFIC_Q


def rule_question(a: Analysis, b: Analysis) -> str | None:
    qa, qb = _qset(a), _qset(b)
    if qa and qb and not (qa & qb):
        return f"question {sorted(qa)} vs {sorted(qb)}"
    # A yes/no question and a why/when/where/who/how-much question want different answers;
    # "can I X" vs "how do I X" usually do not.
    for yn, other in ((a, qb), (b, qa)):
        if yn.yesno and other and not (other <= {"how"}):
            return f"question yes/no vs {sorted(other)}"
    return None


def _prefix_opposite(u: str, v: str) -> bool:
    for p in lex.NEG_PREFIXES:
        # Short roots only for the unambiguous prefixes ("zip"/"unzip"); "dis"+"play" is no opposite.
        root = 3 if p in ("un", "non", "anti") else 4
        if (v == p + u or u == p + v) and min(len(u), len(v)) >= root:
            return True
    for p, q in lex.PREFIX_SWAPS:
        for x, y in ((u, v), (v, u)):
            if x.startswith(p) and y.startswith(q) and x[len(p) :] == y[len(q) :] and len(x) - len(p) >= 3:
                return True
    for x, y in ((u, v), (v, u)):
        if x.endswith("ful") and y.endswith("less") and x[:-3] == y[:-4]:
            return True
    return False


_ANTONYMS: dict[str, set[str]] = {}
for _a, _b in lex.ANTONYM_PAIRS:
    _ANTONYMS.setdefault(canon(stem(_a)), set()).add(canon(stem(_b)))
    _ANTONYMS.setdefault(canon(stem(_b)), set()).add(canon(stem(_a)))


def rule_antonym(a: Analysis, b: Analysis) -> str | None:
    only_a = list((a.words - b.words).elements())
    only_b = list((b.words - a.words).elements())
    for u in only_a:
        for v in only_b:
            if v in _ANTONYMS.get(u, ()) or _prefix_opposite(u, v):
                return f"opposites {u!r} vs {v!r}"
    return None


def _roles(x: Analysis) -> dict[str, str]:
    """Shared-word role from the nearest preceding from/to/into/than within a short window."""
    out: dict[str, str] = {}
    toks = x.tokens
    for i, t in enumerate(toks):
        if not t.anchor:
            continue
        for k in range(i - 1, max(-1, i - 4), -1):
            p = toks[k]
            if p.text in lex.ROLE_PREPS:
                out.setdefault(t.stem, lex.ROLE_PREPS[p.text])
                break
            if p.content:
                break
    return out


def _kind(a: Analysis, b: Analysis, ia: int, ib: int) -> str:
    """num / name / word; a name capitalized mid-sentence on either side counts (sentence-initial
    capitals say nothing)."""
    ta, tb = a.tokens[ia], b.tokens[ib]
    if not ta.content:
        return "num"
    return "name" if ta.specific or tb.specific else "word"


def rule_direction(a: Analysis, b: Analysis) -> str | None:
    def positions(x: Analysis) -> dict[str, list[int]]:
        pos: dict[str, list[int]] = {}
        for i, t in enumerate(x.tokens):
            pos.setdefault(t.stem, []).append(i)
        return pos

    pa, pb = positions(a), positions(b)
    # Words that occur once on each side; numbers and weekdays count ("12 divided by 4").
    anchors = [
        s
        for s, ps in pa.items()
        if len(ps) == 1 and len(pb.get(s, ())) == 1 and a.tokens[ps[0]].anchor and b.tokens[pb[s][0]].anchor
    ]
    # Bounded work on long prompts: the pair loop below is quadratic in anchors.
    anchors = anchors[:_MAX_ANCHORS]
    ra, rb = _roles(a), _roles(b)
    for s in anchors:
        if s in ra and s in rb and ra[s] != rb[s]:
            return f"role of {s!r}: {ra[s]} vs {rb[s]}"

    def pivots(x: Analysis, lo: int, hi: int, content_ok: bool) -> set[str] | None:
        out = set()
        for t in x.tokens[lo + 1 : hi]:
            if t.text in lex.SYMMETRIC:
                return None  # "X and Y", "X vs Y": swapping the sides is harmless
            if t.text == BOUNDARY or t.text in lex.WH_WORDS:
                return None  # a fronted phrase ("Madrid weather, how do I check it?"), not a swap
            if t.text in lex.PIVOT_FUNCTION_WORDS or (content_ok and t.content):
                out.add(t.stem)
        return out

    for i, x in enumerate(anchors):
        for y in anchors[i + 1 :]:
            ax, ay, bx, by = pa[x][0], pa[y][0], pb[x][0], pb[y][0]
            if (ax < ay) == (bx < by):
                continue
            # A content word in between is a pivot ("Alice owes Bob", "dog eat cat food") only for
            # two words of the same kind; "format a date in Java" vs "Java date formatting" is not.
            content_ok = _kind(a, b, ax, bx) == _kind(a, b, ay, by)
            pa_set = pivots(a, min(ax, ay), max(ax, ay), content_ok)
            pb_set = pivots(b, min(bx, by), max(bx, by), content_ok)
            if pa_set is None or pb_set is None:
                continue
            common = (pa_set & pb_set) - {x, y}
            if common:
                return f"{x!r} and {y!r} swap around {sorted(common)[0]!r}"
    return None


@dataclass(frozen=True)
class ContentDiff:
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    specific: tuple[str, ...]


_MAX_TYPO_CANDIDATES = 32
_MAX_ANCHORS = 64


def content_diff(a: Analysis, b: Analysis) -> ContentDiff:
    """Content words of each side that have no counterpart on the other (stem, synonym, typo, split)."""

    def unmatched(x: Analysis, y: Analysis) -> list[Token]:
        y_stems = {t.stem for t in y.tokens} | {t.text for t in y.tokens}
        x_stems = {u.stem for u in x.tokens}
        y_left = [t for t in y.tokens if t.content and t.stem not in x_stems]
        # Typo matching is quadratic; long prompts that differ in many words are not typos anyway.
        if len(y_left) > _MAX_TYPO_CANDIDATES:
            y_left = []
        x_texts = [t.text for t in x.tokens]
        out = []
        for i, t in enumerate(x.tokens):
            if not t.content or t.stem in y_stems or t.text in y_stems:
                continue
            # Split on one side, glued on the other: "web site"/"website", "sci fi"/"scifi".
            if (i + 1 < len(x_texts) and x_texts[i] + x_texts[i + 1] in y_stems) or (
                i > 0 and x_texts[i - 1] + x_texts[i] in y_stems
            ):
                continue
            if any(is_typo(t.text, u.text) or is_typo(t.stem, u.stem) for u in y_left):
                continue
            out.append(t)
        return out

    ua, ub = unmatched(a, b), unmatched(b, a)
    # A word glued on this side that is split on the other ("login" vs "log in") was matched above
    # through the other side's pairs; drop it here too.
    b_pairs = {x.text + y.text for x, y in zip(b.tokens, b.tokens[1:], strict=False)}
    a_pairs = {x.text + y.text for x, y in zip(a.tokens, a.tokens[1:], strict=False)}
    ua = [t for t in ua if t.text not in b_pairs]
    ub = [t for t in ub if t.text not in a_pairs]
    specific = tuple(t.text for t in (*ua, *ub) if t.specific)
    return ContentDiff(tuple(t.text for t in ua), tuple(t.text for t in ub), specific)


GUARDS = (
    ("negation", rule_negation),
    ("number", rule_number),
    ("date", rule_date),
    ("question", rule_question),
    ("antonym", rule_antonym),
    ("direction", rule_direction),
)


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
