"""The verifier's rules: cheap, explainable checks on two prompts, each naming why their answers may
differ, and `content_diff`, the content words of each side without a counterpart on the other.

Embedding cosine alone serves wrong answers on look-alike prompts ("cancel" vs "don't cancel",
"Paris to Rome" vs "Rome to Paris", "3 tablets" vs "30 tablets", "all users" vs "admin users",
"increase" vs "decrease", "how" vs "why"). The guard rules run in the order of GUARDS; what each
vetoes is listed once, in the verifier's docstring (cache/verify/verifier.py).

The verifier (cache/verify/verifier.py) runs them alone (rules mode) or as features of the learned
scorer (cache/pairfeatures.py). Pure functions of two analyses (cache.verify.analysis), importing
neither the verifier nor the scorer: the pair features and the verifier both build on them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cache.verify import lexicon as lex
from cache.verify.analysis import BOUNDARY, Analysis, Token, canon, is_typo, stem


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
