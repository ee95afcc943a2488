"""The eval harness's text tables (semserve.tooling.cache_eval_report) on hand-made outcomes."""

from __future__ import annotations

from semserve.tooling.cache_eval import Outcome, Pair, summarize
from semserve.tooling.cache_eval_report import format_categories, format_mistakes, format_reports

SAME = Pair("reset my password", "how do I reset my password", True, "paraphrase")
DIFF = Pair("flights to Rome", "flights to Paris", False, "lookalike")


def test_mistakes_list_only_wrong_decisions() -> None:
    report = summarize(
        "verifier", [Outcome(SAME, False, "knn_floor", 0.61, "low"), Outcome(DIFF, True, "scorer", 0.93, "")]
    )
    lines = format_mistakes(report).splitlines()
    assert len(lines) == 2
    assert lines[0].split()[0] == "missed" and "[paraphrase] knn_floor 0.610" in lines[0]
    assert lines[1].strip().startswith("WRONG SERVE") and "'flights to Rome' / 'flights to Paris'" in lines[1]
    assert format_mistakes(summarize("ok", [Outcome(SAME, True), Outcome(DIFF, False)])) == ""


def test_tables_name_every_method_and_category() -> None:
    good = summarize("verifier", [Outcome(SAME, True), Outcome(DIFF, False)])
    loose = summarize("cosine>=0.80", [Outcome(SAME, True), Outcome(DIFF, True)])
    table = format_reports("split: x.jsonl (2 pairs)", [good, loose], per_category=good)
    assert table.splitlines()[0] == "split: x.jsonl (2 pairs)"
    assert "verifier" in table and "cosine>=0.80" in table and "1/1" in table
    cats = format_categories([good, loose])
    paraphrase = next(line for line in cats.splitlines() if "paraphrase" in line)
    lookalike = next(line for line in cats.splitlines() if "lookalike" in line)
    assert paraphrase.split()[-2:] == ["100.0%", "100.0%"]
    assert lookalike.split()[-2:] == ["W0.0%", "W100.0%"]
