"""Build the project's labelled pair set from the hand-written seeds in cache/data/seeds_*.txt.

Deterministic (no clock, no global random state): the same seeds give byte-identical files.

    semserve cache pairs                        # writes cache/data/pairs_{train,calib,test}.jsonl
    .venv/bin/python -m semserve.tooling.pair_generation    # the same

Each seed *intent* is a group of phrasings with the same answer ("=" lines), look-alikes with
another answer ("! kind:" lines) and slots filled from value lists. From one intent:

  near_repeat         a phrasing vs itself with surface noise (case, punctuation, a typo, filler)
  paraphrase          two "=" phrasings of the same filling that share most content words
  paraphrase_reworded two "=" phrasings that share few content words (overlap under 0.35)
  <trap kind>         a "=" phrasing vs a "!" line of the same filling
  swapped_entity      the same phrasing with another value in an entity slot, or two slots
                      traded (from A to B / from B to A)
  number_date         the same phrasing with another value in a number/date slot

The split is by intent (the seed group), decided by a hash of the intent id, ONCE: every variant of
one seed lands in the same split, so the test split measures intents the scorer never saw.
Intents in cache/data/seeds_extra_*.txt (written after the test split was fixed) go to train or
calibration only: the same hash; where it would pick test, that slice is re-divided train:calib
55:22. They are read after the others, so adding them leaves pairs_test.jsonl byte-identical.
Categories are what the README's tables report on; "same" categories must be served, the others not.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cache.scorer import DATA_DIR

SPLIT_FILES = {s: DATA_DIR / f"pairs_{s}.jsonl" for s in ("train", "calib", "test")}
# Share of intents per split (by hash of the intent id): enough calibration pairs to estimate a
# 1 % error rate, a test split the size of a real held-out set.
SPLIT_SHARES = (("train", 0.55), ("calib", 0.22), ("test", 0.23))
# Seeds added once the test split was fixed: train and calib only.
EXTRA_SEEDS_GLOB = "seeds_extra_*.txt"
SAME_CATEGORIES = ("near_repeat", "paraphrase", "paraphrase_reworded")
TRAP_CATEGORIES = (
    "negation",
    "swapped_entity",
    "number_date",
    "scope",
    "antonym",
    "different_question",
)
MAX_FILLINGS = 4
MAX_PARAPHRASE_PAIRS = 6  # per filling
_SLOT = re.compile(r"\{(\w+)\}")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an the i my me we our you your is are am be do does did can could would should will to of in "
    "on at for with how what why when where which who it this that there if and or any some please "
    "get have has was".split()
)


@dataclass
class Intent:
    id: str
    domain: str
    slots: dict[str, list[str]] = field(default_factory=dict)
    numeric: set[str] = field(default_factory=set)
    swap: tuple[str, str] | None = None
    same: list[str] = field(default_factory=list)
    traps: list[tuple[str, str]] = field(default_factory=list)
    # False for seeds_extra_*.txt: the intent may land in train or calib, never in test.
    may_be_test: bool = True


def parse_seeds(text: str, source: str = "seeds", may_be_test: bool = True) -> list[Intent]:
    intents: list[Intent] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("=="):
            parts = [p.strip() for p in line[2:].split("|")]
            it = Intent(parts[0], parts[1], may_be_test=may_be_test)
            for p in parts[2:]:
                key, _, vals = p.partition("=")
                if key == "swap":
                    a, b = vals.split(",")
                    it.swap = (a.strip(), b.strip())
                    continue
                if key.startswith("n:"):
                    key = key[2:]
                    it.numeric.add(key)
                it.slots[key] = [v.strip() for v in vals.split(";")]
            intents.append(it)
        elif not intents:
            raise ValueError(f"{source}:{n}: phrasing before the first '==' intent")
        elif line.startswith("="):
            intents[-1].same.append(line[1:].strip())
        elif line.startswith("!"):
            kind, _, phrase = line[1:].partition(":")
            kind = kind.strip()
            if kind not in TRAP_CATEGORIES:
                raise ValueError(f"{source}:{n}: unknown trap kind {kind!r}")
            intents[-1].traps.append((kind, phrase.strip()))
        else:
            raise ValueError(f"{source}:{n}: cannot parse {line!r}")
    ids = [i.id for i in intents]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"{source}: duplicate intent ids {sorted(dup)}")
    return intents


def load_intents(data_dir: Path = DATA_DIR) -> list[Intent]:
    """Every seed file's intents, the extra (train/calib-only) files last: pairs are deduplicated
    first come first kept, so an extra seed can never take a pair away from the test split."""
    extra = sorted(data_dir.glob(EXTRA_SEEDS_GLOB))
    main = [p for p in sorted(data_dir.glob("seeds_*.txt")) if p not in extra]
    out: list[Intent] = []
    for path in main + extra:
        out += parse_seeds(path.read_text(encoding="utf-8"), path.name, may_be_test=path not in extra)
    ids = [i.id for i in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"intent ids used in more than one seed file: {sorted(dup)}")
    return out


def _pick(h: float, shares: tuple[tuple[str, float], ...]) -> str:
    acc = 0.0
    for name, share in shares:
        acc += share
        if h < acc:
            return name
    return shares[-1][0]


def split_of(intent_id: str, may_be_test: bool = True) -> str:
    h = int.from_bytes(hashlib.sha256(intent_id.encode()).digest()[:8], "big") / 2**64
    split = _pick(h, SPLIT_SHARES)
    if split != "test" or may_be_test:
        return split
    # The test slice (last in SPLIT_SHARES) re-divided in the train:calib proportion: an extra
    # intent whose hash picks train or calib lands exactly where a main intent would.
    kept = tuple((n, s) for n, s in SPLIT_SHARES if n != "test")
    below = sum(s for _, s in kept)
    return _pick((h - below) / (1.0 - below) * below, kept)


def _rng(*parts: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256("|".join(parts).encode()).digest()[:8], "big"))


def _fill(text: str, values: dict[str, str]) -> str:
    out = _SLOT.sub(lambda m: values[m.group(1)], text)
    return out[0].upper() + out[1:] if out else out


def _content(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def overlap(a: str, b: str) -> float:
    ca, cb = _content(a), _content(b)
    return len(ca & cb) / max(1, len(ca | cb))


REWORDED_BELOW = 0.35


def _fillings(it: Intent) -> list[dict[str, str]]:
    names = sorted(it.slots)
    if not names:
        return [{}]
    products = itertools.product(*(it.slots[k] for k in names))
    combos = [dict(zip(names, vals, strict=True)) for vals in products]
    rng = _rng(it.id, "fillings")
    rng.shuffle(combos)
    if it.swap:
        a, b = it.swap
        combos = [c for c in combos if c[a] != c[b]]
    return combos[:MAX_FILLINGS]


_CONTRACT = (("do not", "don't"), ("I am", "I'm"), ("what is", "what's"), ("can not", "can't"))
_FILLERS = ("please", "thanks", "quick question:", "hi,", "hey,", "hello,")


def near_repeat(text: str, rng: random.Random) -> str:
    """The same question typed again: case, punctuation, filler, a contraction, one typo."""
    out = text
    ops = rng.sample(range(6), k=2)
    for op in ops:
        if op == 0:
            out = out.lower()
        elif op == 1:
            out = out.rstrip("?.!") if out[-1:] in "?.!" else out + "?"
        elif op == 2:
            f = rng.choice(_FILLERS)
            out = f"{f} {out[0].lower()}{out[1:]}" if f.endswith((":", ",")) else f"{out.rstrip('?.!')} {f}"
        elif op == 3:
            for full, short in _CONTRACT:
                if full in out:
                    out = out.replace(full, short, 1)
                    break
            else:
                out = out.replace("  ", " ") + " "
        elif op == 4:
            words = out.split()
            long = [i for i, w in enumerate(words) if len(w) >= 6 and w.isalpha()]
            if long:
                i = rng.choice(long)
                w = words[i]
                j = rng.randrange(1, len(w) - 2)
                words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
                out = " ".join(words)
        else:
            out = out.upper() if len(out) < 40 and rng.random() < 0.3 else "  " + out
    return out.strip() if out.strip() != text else out.strip().lower()


def pairs_of(it: Intent) -> Iterator[dict[str, object]]:
    rng = _rng(it.id, "pairs")
    fills = _fillings(it)

    def row(a: str, b: str, same: bool, cat: str) -> dict[str, object]:
        return {"a": a, "b": b, "same_answer": same, "category": cat, "group": it.id, "domain": it.domain}

    for fi, values in enumerate(fills):
        same = [_fill(s, values) for s in it.same]
        combos = list(itertools.combinations(range(len(same)), 2))
        rng.shuffle(combos)
        for i, j in combos[:MAX_PARAPHRASE_PAIRS]:
            a, b = (same[i], same[j]) if rng.random() < 0.5 else (same[j], same[i])
            cat = "paraphrase_reworded" if overlap(a, b) < REWORDED_BELOW else "paraphrase"
            yield row(a, b, True, cat)
        for s in rng.sample(same, k=min(2, len(same))):
            yield row(s, near_repeat(s, rng), True, "near_repeat")
        for kind, trap in it.traps:
            t = _fill(trap, values)
            # Two bases per trap: the look-alike must be rejected whichever phrasing was cached.
            for base in rng.sample(same, k=min(2, len(same))):
                yield row(base, t, False, kind) if rng.random() < 0.5 else row(t, base, False, kind)
        # Another value in one slot: the same words around a different entity or number.
        other = fills[(fi + 1) % len(fills)] if len(fills) > 1 else None
        if other is not None:
            for name in sorted(it.slots):
                if other[name] == values[name]:
                    continue
                changed = {**values, name: other[name]}
                if it.swap and changed[it.swap[0]] == changed[it.swap[1]]:
                    continue
                s = rng.choice([x for x in it.same if "{" + name + "}" in x] or [""])
                if not s:
                    continue
                cat = "number_date" if name in it.numeric else "swapped_entity"
                yield row(_fill(s, values), _fill(s, changed), False, cat)
        if it.swap:
            x, y = it.swap
            s = rng.choice(it.same)
            swapped = {**values, x: values[y], y: values[x]}
            yield row(_fill(s, values), _fill(s, swapped), False, "swapped_entity")


def build(data_dir: Path = DATA_DIR) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {s: [] for s in SPLIT_FILES}
    seen: set[tuple[str, str]] = set()
    for it in load_intents(data_dir):
        for r in pairs_of(it):
            key = (str(r["a"]), str(r["b"]))
            if key in seen or r["a"] == r["b"]:
                continue
            seen.add(key)
            out[split_of(it.id, it.may_be_test)].append(r)
    return out


def write(data_dir: Path = DATA_DIR) -> dict[str, int]:
    splits = build(data_dir)
    for name, rows in splits.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (data_dir / f"pairs_{name}.jsonl").write_text(text, encoding="utf-8")
    return {k: len(v) for k, v in splits.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(write(args.data_dir)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semserve.tooling.pair_generation", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
