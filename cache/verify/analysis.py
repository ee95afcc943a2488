"""Per-text analysis for the verifier: one prompt in, the facts the rules compare out (`analyze`).

Normalization (Unicode, quotes, contractions, phrasal verbs), tokens with light stemming and synonym
groups, numbers with their units, codes, dates and times, question types, negations, and which words
are content, proper nouns or swap anchors. Pure Python on short strings, memoized per text.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from cache.verify import lexicon as lex

# All phrase rewrites in one pass (one alternation, group pN = lex.PHRASES[N]).
_PHRASE_RE = re.compile("|".join(f"(?P<p{i}>{pat})" for i, (pat, _rep) in enumerate(lex.PHRASES)))
_TOKEN_RE = re.compile(r"\d+(?:[.,:/]\d+)*(?:st|nd|rd|th)?|[a-z0-9]+(?:'[a-z]+)*|[%$€£¥°&+]|[,;:?!.]", re.I)
# Clause boundaries (punctuation) become this marker: fronted phrases ("Madrid weather, how do I
# check it?") must not look like swapped arguments.
BOUNDARY = "|"
_NUMBERISH = re.compile(r"^\d+(?:[.,:/]\d+)*$")
_ORDINAL_DIGITS = re.compile(r"^(\d+)(?:st|nd|rd|th)$")
_NUM_UNIT = re.compile(r"^(\d+(?:\.\d+)?)([a-z%°]+)$")


def stem(w: str) -> str:
    """Light suffix stripping (plural, -ing, -ed, -ly, final -e) so inflections compare equal."""
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith(("ches", "shes", "xes", "zes", "sses")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is", "ous")):
        w = w[:-1]
    if w.endswith("ing") and len(w) > 5:
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "ls":
            w = w[:-1]
        elif len(w) > 2 and w[-1] == w[-2] == "l":
            w = w[:-1]
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] != "s":
            w = w[:-1]
    elif w.endswith("ly") and len(w) > 5:
        w = w[:-2]
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    if w.endswith("y") and len(w) > 3:
        w = w[:-1] + "i"
    return w


def _build_synonyms() -> dict[str, str]:
    out: dict[str, str] = {}
    for words in lex.SYNONYM_GROUPS:
        head = stem(words[0])  # the first word of a group names it
        for w in words:
            out.setdefault(stem(w), head)
    return out


_SYN = _build_synonyms()


def canon(s: str) -> str:
    """The head of the synonym group of stem `s` (itself if it has none)."""
    return _SYN.get(s, s)


_STOP_STEMS = frozenset(stem(w) for w in lex.STOPWORDS)
_FRAMING_STEMS = frozenset(stem(w) for w in lex.FRAMING)


# Unit words that are not also common words or letters: "ounces" matches "oz" even with no number.
_UNIT_WORDS = {
    w: u
    for w, u in lex.UNITS.items()
    if len(w) > 1 and w.isalpha() and w not in {"in", "am", "pm", "min", "second", "sec", "day", "days"}
}


def _word_key(w: str) -> str:
    """What a word is compared by: its unit, or else the head of its stem's synonym group."""
    unit = _UNIT_WORDS.get(w)
    if unit is not None:
        return "unit:" + unit
    return canon(stem(w))


def _damerau(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance, giving up (returning limit+1) once it exceeds `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


def is_typo(a: str, b: str) -> bool:
    """Plausible misspelling of one another: longer words tolerate more edits."""
    n = min(len(a), len(b))
    if n < 4 or not (a.isalpha() and b.isalpha()):
        return False
    if n < 6:
        return a[0] == b[0] and _damerau(a, b, 1) <= 1
    return _damerau(a, b, 2 if n >= 8 else 1) <= (2 if n >= 8 else 1)


@dataclass(frozen=True)
class Token:
    text: str  # lowercase surface form
    stem: str  # comparison key: unit, or synonym-group head of the stem (see _word_key)
    specific: bool  # proper noun, acronym or code-like (version, error code)
    content: bool  # counts as a content word
    anchor: bool  # can take part in a swap: content words, numbers, weekdays and months


@dataclass(frozen=True)
class Analysis:
    norm: str
    tokens: tuple[Token, ...]
    negations: int
    quantities: tuple[tuple[str, str | None, bool], ...]  # (value, unit, weak)
    codes: frozenset[str]
    times: frozenset[str]
    qtypes: frozenset[str]
    yesno: bool
    words: Counter[str] = field(compare=False)  # stems of all tokens, function words included


# A number found in the words: (value, start, end, weak), words[start:end] spell it.
_Number = tuple[float, int, int, bool]


@dataclass(frozen=True)
class _Words:
    """A text split into comparable words, before any rule-specific reading."""

    original: list[str]  # tokens of the text as typed (for capitalization)
    low: str  # lowercased, contractions and phrases rewritten (for the "what ..." patterns)
    words: list[str]  # comparable words; clause punctuation is BOUNDARY
    surface: list[str]  # the same words before irregular forms were mapped


def _normalize(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'").replace("`", "'")
    t = t.replace("“", '"').replace("”", '"')
    return t


def _expand_contractions(low: str) -> str:
    def repl(m: re.Match[str]) -> str:
        w = m.group(0)
        if w in lex.CONTRACTIONS:
            return lex.CONTRACTIONS[w]
        for suf, rep in lex.SUFFIX_CONTRACTIONS:
            if w.endswith(suf):
                return w[: -len(suf)] + rep
        return w

    return re.sub(r"[a-z]+(?:'[a-z]+)?", repl, low)


def _split_words(text: str) -> _Words:
    t = _normalize(text)
    # Thousands separators and "-free" compounds before splitting on punctuation.
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
    # "gluten-free" is "without gluten": a negation, and the same words as the spelled-out form.
    t = re.sub(r"\b([a-z]+)-free\b", r"without \1", t, flags=re.I)
    # Hyphens split words ("three-day" -> "three day"); "e-mail" still matches "email" through the
    # split-word check in content_diff.
    original = _TOKEN_RE.findall(t)
    low = _expand_contractions(t.lower())
    low = _PHRASE_RE.sub(lambda m: lex.PHRASES[int(m.lastgroup[1:])][1], low)  # type: ignore[index]
    # Split "100ml", "5mg", "3pm", "180°c" into value + unit; strip ordinal suffixes.
    words: list[str] = []
    for w in _TOKEN_RE.findall(low):
        m = _NUM_UNIT.match(w)
        if m and (
            m.group(2) in lex.UNITS or m.group(2) in lex.TEMP_SCALES or m.group(2) in ("st", "nd", "rd", "th")
        ):
            if m.group(2) in ("st", "nd", "rd", "th"):
                words.append(m.group(1))
            else:
                words.extend([m.group(1), m.group(2)])
        else:
            words.append(w)
    surface = [w.replace("'", "") for w in words]  # before irregular forms: "wrote" is no request framing
    words = [
        "plus" if w == "+" else BOUNDARY if w in ",;:?!." else lex.IRREGULAR.get(w, w).replace("'", "")
        for w in words
    ]
    return _Words(original, low, words, surface)


def _capitalized(original: list[str]) -> set[str]:
    """Proper nouns and acronyms by the original capitalization (not sentence-initial, not "I")."""
    caps: set[str] = set()
    sentence_start = True
    for ot in original:
        if ot in ".?!":
            sentence_start = True
            continue
        o = ot.replace("'", "")
        if (
            (o[:1].isupper() and not sentence_start and o.lower() != "i")
            or (len(o) >= 2 and o.isupper())
            or (any(c.isupper() for c in o[1:]) and any(c.islower() for c in o))
        ):
            caps.add(o.lower())
        sentence_start = False
    return caps


def _parse_numbers(words: list[str]) -> tuple[list[_Number], set[int]]:
    """Number words and digits -> [(value, start, end, weak)], plus the positions they cover."""
    out: list[_Number] = []
    used: set[int] = set()
    i = 0
    while i < len(words):
        w = words[i]
        if _NUMBERISH.match(w) and "/" not in w and ":" not in w:
            raw = w.replace(",", "") if re.fullmatch(r"\d{1,3}(,\d{3})+", w) else w.replace(",", ".")
            try:
                val = float(raw)
            except ValueError:
                i += 1
                continue
            j = i + 1
            if j < len(words) and words[j] in lex.SCALES:
                val *= lex.SCALES[words[j]]
                j += 1
            out.append((val, i, j, False))
            used.update(range(i, j))
            i = j
            continue
        m = _ORDINAL_DIGITS.match(w)
        if m:
            out.append((float(m.group(1)), i, i + 1, False))
            used.add(i)
            i += 1
            continue
        if w in lex.ORDINALS:
            out.append((float(lex.ORDINALS[w]), i, i + 1, w in lex.WEAK_WORDS))
            used.add(i)
            i += 1
            continue
        if w in lex.NUM_WORDS or (w in lex.SCALES and i > 0 and words[i - 1] in ("a", "one")):
            total, cur, j = 0.0, 0.0, i
            start_weak = w in lex.WEAK_WORDS
            while j < len(words) and (
                words[j] in lex.NUM_WORDS or words[j] in lex.SCALES or words[j] == "and"
            ):
                x = words[j]
                if x == "and":
                    if j + 1 < len(words) and (words[j + 1] in lex.NUM_WORDS) and cur >= 100:
                        j += 1
                        continue
                    break
                if x in lex.SCALES:
                    cur = (cur or 1.0) * lex.SCALES[x]
                    if lex.SCALES[x] >= 1000:
                        total += cur
                        cur = 0.0
                else:
                    cur += lex.NUM_WORDS[x]
                j += 1
            val = total + cur
            weak = start_weak and j == i + 1
            if w == "dozen" or (w in lex.SCALES):
                weak = False
            out.append((val, i, j, weak))
            used.update(range(i, j))
            i = j
            continue
        i += 1
    return out, used


def _quantities(words: list[str], nums: list[_Number]) -> tuple[list[tuple[str, str | None, bool]], set[int]]:
    """Each number as (value, unit, weak), and the positions of the unit words."""
    quantities: list[tuple[str, str | None, bool]] = []
    unit_pos: set[int] = set()
    for val, start, end, weak in nums:
        unit: str | None = None
        j = end
        # "in" after a number is a preposition far more often than inches ("$500 in small claims
        # court"): an inch only at the end of a clause ("12 in").
        inch_word = j < len(words) and words[j] == "in" and j + 1 < len(words) and words[j + 1] != BOUNDARY
        if start > 0 and words[start - 1] in lex.CURRENCY_PREFIX:
            unit = lex.UNITS[words[start - 1]]
            unit_pos.add(start - 1)
        elif j < len(words) and words[j] in lex.UNITS and not inch_word:
            unit = lex.UNITS[words[j]]
            unit_pos.add(j)
            if unit == "deg" and j + 1 < len(words) and words[j + 1] in lex.TEMP_SCALES:
                unit = lex.TEMP_SCALES[words[j + 1]]
                unit_pos.add(j + 1)
        if unit == "thousand":
            val *= 1000
            unit = None
        # 1 is as often "a"/"an" as a quantity ("a pound" vs "1 lb"): it never vetoes on its own.
        quantities.append((f"{val:g}", unit, (weak and val in lex.WEAK_VALUES) or val == 1.0))
    return quantities, unit_pos


def _codes(words: list[str], num_pos: set[int]) -> frozenset[str]:
    """Code-like words: digits mixed with letters (versions, error codes), paths, times of day."""
    return frozenset(
        w
        for i, w in enumerate(words)
        if i not in num_pos and any(c.isdigit() for c in w) and not _NUMBERISH.match(w)
    ) | frozenset(w for w in words if "/" in w or ":" in w)


def _times(words: list[str], caps: set[str]) -> tuple[set[str], set[int]]:
    """Dates and times (weekdays, months, today/tomorrow, next week, seasons) and their positions."""
    times: set[str] = set()
    time_pos: set[int] = set()
    for i, w in enumerate(words):
        before = len(times)
        prev = words[i - 1] if i > 0 else ""
        nxt = words[i + 1] if i + 1 < len(words) else ""
        near_num = bool(_NUMBERISH.match(prev) or _NUMBERISH.match(nxt) or _ORDINAL_DIGITS.match(nxt))
        if w in lex.WEEKDAYS:
            times.add(lex.WEEKDAYS[w])
        elif w in lex.WEEKDAY_ABBR and (prev in lex.TIME_PREPS or near_num or w in caps):
            times.add(lex.WEEKDAY_ABBR[w])
        elif w in lex.MONTHS:
            if w not in lex.AMBIGUOUS_MONTHS or w in caps or near_num or prev in lex.TIME_PREPS:
                if w == "may" and prev not in lex.TIME_PREPS and not near_num and i == 0:
                    continue
                times.add(f"month{lex.MONTHS[w]}")
        elif w in lex.RELATIVE_TIME:
            times.add(lex.RELATIVE_TIME[w])
        elif w in lex.SEASON_AMBIGUOUS and prev in lex.TIME_PREPS | {"the"}:
            times.add(lex.SEASON_AMBIGUOUS[w])
        if len(times) > before:
            time_pos.add(i)
        if w in lex.TIME_DEICTIC and nxt and (nxt in lex.TIME_UNITS or stem(nxt) in lex.TIME_UNITS):
            times.add(f"{'this' if w in ('this', 'coming', 'upcoming') else w}:{stem(nxt)}")
            time_pos.update((i, i + 1))
    return times, time_pos


def _question_types(low: str, words: list[str]) -> tuple[frozenset[str], bool]:
    """The question types asked (why, how, how_much, when, where, where_how, who) and whether it is
    a yes/no question."""
    qtypes: set[str] = set()
    for pat, qt in lex.WHAT_AS:
        if pat.search(low):
            qtypes.add(qt)
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w == "why":
            qtypes.add("why")
        elif w == "how":
            qtypes.add("how_much" if nxt in lex.HOW_MEASURE else "how")
        elif w == "when":
            qtypes.add("when")
        elif w == "where":
            # "where do I report a bug" asks for a procedure as much as "how do I report a bug".
            procedural = (
                nxt in ("do", "can", "should") and i + 2 < len(words) and words[i + 2] in ("i", "we", "you")
            )
            qtypes.add("where_how" if procedural else "where")
        elif w in ("who", "whom", "whose"):
            qtypes.add("who")
    yesno = bool(words) and words[0] in lex.AUX_START and not qtypes
    return frozenset(qtypes), yesno


def _count_negations(words: list[str]) -> int:
    # Glued "non" compounds negate too ("nonrefundable", "nonsmoking"); "nonetheless" does not.
    return sum(
        1
        for w in words
        if w in lex.NEGATIONS or (w.startswith("non") and len(w) >= 7 and w not in lex.NON_WORDS)
    )


def _tokens(
    split: _Words, caps: set[str], num_pos: set[int], unit_pos: set[int], time_pos: set[int]
) -> tuple[Token, ...]:
    skip = num_pos | unit_pos | time_pos
    tokens: list[Token] = []
    for i, w in enumerate(split.words):
        if not w or w in "%$€£¥°&+":
            continue
        if w == BOUNDARY:
            tokens.append(Token(w, w, False, False, False))
            continue
        key = _word_key(w)
        # Stopword and framing lists apply to the word itself, not its synonym group: "make" frames
        # a request, "create" (same group) does not.
        raw_stem = stem(split.surface[i])
        content = (
            i not in skip
            and w not in lex.STOPWORDS
            and raw_stem not in _STOP_STEMS
            and w not in lex.NEGATIONS
            and raw_stem not in _FRAMING_STEMS
        )
        specific = content and (w in caps or any(c.isdigit() for c in w))
        anchor = content or (i in num_pos) or (i in time_pos and (w in lex.WEEKDAYS or w in lex.MONTHS))
        tokens.append(Token(w, key, specific, content, anchor))
    return tuple(tokens)


@lru_cache(maxsize=8192)
def analyze(text: str) -> Analysis:
    """Everything the rules need about one text. Memoized: cached prompts are checked repeatedly."""
    split = _split_words(text)
    words = split.words
    caps = _capitalized(split.original)
    nums, num_pos = _parse_numbers(words)
    quantities, unit_pos = _quantities(words, nums)
    times, time_pos = _times(words, caps)
    qtypes, yesno = _question_types(split.low, words)
    return Analysis(
        norm=" ".join(w for w in words if w != BOUNDARY),
        tokens=_tokens(split, caps, num_pos, unit_pos, time_pos),
        negations=_count_negations(words),
        quantities=tuple(quantities),
        codes=_codes(words, num_pos),
        times=frozenset(times),
        qtypes=qtypes,
        yesno=yesno,
        words=Counter(_word_key(w) for w in words if w != BOUNDARY),
    )
