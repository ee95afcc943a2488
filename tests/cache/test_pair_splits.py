"""The pair set's test split is fixed once (issue 13): seeds added later (cache/data/seeds_extra_*.txt)
go to train or calibration only, and the committed pairs_test.jsonl stays byte-identical."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cache.scorer import DATA_DIR
from semserve.tooling import pair_generation

# sha256 of cache/data/pairs_test.jsonl as committed in 9603a6b (150 intents, 769 pairs), before any
# extra seed existed. Changing it means the held-out split changed: it must not.
TEST_SPLIT_SHA256 = "8366d58f40572193448ed4ec39e616560f7365d1a89405496c7d182555c7df72"


def _extra_ids() -> set[str]:
    return {i.id for i in pair_generation.load_intents() if not i.may_be_test}


def test_test_split_is_byte_identical_to_the_fixed_one() -> None:
    assert hashlib.sha256((DATA_DIR / "pairs_test.jsonl").read_bytes()).hexdigest() == TEST_SPLIT_SHA256
    built = pair_generation.build()["test"]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in built)
    assert hashlib.sha256(text.encode()).hexdigest() == TEST_SPLIT_SHA256


def test_no_extra_intent_lands_in_test() -> None:
    extra = _extra_ids()
    assert extra, "cache/data/seeds_extra_*.txt holds no intent"
    built = pair_generation.build()
    groups = {s: {str(r["group"]) for r in rows} for s, rows in built.items()}
    assert not extra & groups["test"]
    assert extra <= groups["train"] | groups["calib"]
    # Nor does any prompt an extra seed produces appear, word for word, in the test split.
    test_texts = {str(r[k]) for r in built["test"] for k in ("a", "b")}
    extra_texts = {
        str(r[k]) for s in ("train", "calib") for r in built[s] if r["group"] in extra for k in ("a", "b")
    }
    assert not extra_texts & test_texts


def test_extra_seeds_split_train_calib_by_the_same_hash(tmp_path: Path) -> None:
    ids = [f"intent_{n}" for n in range(400)]
    seeds = "".join(f"== {i} | demo\n= How do I do {i}?\n= Way to do {i}\n" for i in ids)
    (tmp_path / "seeds_extra_a.txt").write_text(seeds)
    built = pair_generation.build(tmp_path)
    assert not built["test"]
    groups = {s: {str(r["group"]) for r in rows} for s, rows in built.items()}
    # The same hash as the main seeds: an id the main shares put in train or calib stays there.
    for i in ids:
        main_split = pair_generation.split_of(i)
        if main_split != "test":
            assert i in groups[main_split]
            assert pair_generation.split_of(i, may_be_test=False) == main_split
    share = len(groups["train"]) / (len(groups["train"]) + len(groups["calib"]))
    assert abs(share - 0.55 / 0.77) < 0.08


def test_extra_seeds_are_read_after_the_main_ones(tmp_path: Path) -> None:
    # Pairs are deduplicated first come, first kept: read last, an extra seed that repeats a main
    # seed's phrasings cannot take those pairs away from the main seed's split.
    (tmp_path / "seeds_extra_a.txt").write_text("== late | demo\n= Where is the exit?\n= Exit, where?\n")
    (tmp_path / "seeds_z.txt").write_text("== early | demo\n= Where is the exit?\n= Exit, where?\n")
    intents = pair_generation.load_intents(tmp_path)
    assert [(i.id, i.may_be_test) for i in intents] == [("early", True), ("late", False)]
    groups = {str(r["group"]) for rows in pair_generation.build(tmp_path).values() for r in rows}
    assert "early" in groups


def test_an_intent_id_may_appear_in_one_seed_file_only(tmp_path: Path) -> None:
    (tmp_path / "seeds_a.txt").write_text("== same | demo\n= a b c\n")
    (tmp_path / "seeds_extra_a.txt").write_text("== same | demo\n= d e f\n")
    with pytest.raises(ValueError, match="same"):
        pair_generation.load_intents(tmp_path)
