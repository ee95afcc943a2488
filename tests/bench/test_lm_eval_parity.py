"""`semserve bench lm-eval`: lm-eval's samples read, and runs compared request by request (no
server, no lm-eval: it is no dependency of semserve)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.lm_eval_parity import TASKS_DIR, Run, Scored, compare, parse_target, read_samples, table
from tests.support import ROOT


def _samples(path: Path, rows: list[list[list[object]]]) -> Path:
    # lm-eval 0.4.13 writes each choice's [loglikelihood, is_greedy] as strings.
    lines = [json.dumps({"doc_id": i, "filtered_resps": [[str(a), str(b)] for a, b in row]})
             for i, row in enumerate(rows)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_samples_are_read_per_choice(tmp_path: Path) -> None:
    scored = read_samples(_samples(tmp_path / "s.jsonl", [[[-0.25, True], [-12.5, False]]]), "t")
    assert scored == {("t", 0, 0): Scored(-0.25, True), ("t", 0, 1): Scored(-12.5, False)}


def test_runs_compare_request_by_request(tmp_path: Path) -> None:
    ref = read_samples(_samples(tmp_path / "a.jsonl", [[[-0.25, True], [-12.5, False]], [[-1.0, True]]]), "t")
    same = dict(ref)
    off = {**ref, ("t", 0, 1): Scored(-12.4, False), ("t", 1, 0): Scored(-1.0, False)}
    assert compare(ref, same).identical == 3 and compare(ref, same).max_abs_diff == 0.0
    parity = compare(ref, off)
    assert (parity.identical, parity.greedy_agree, parity.missing) == (2, 2, 0)
    assert parity.max_abs_diff == pytest.approx(0.1)
    short = compare(ref, {k: v for k, v in ref.items() if k[1] == 0})
    assert (short.requests, short.missing) == (2, 1)
    text = table([Run("vllm", {"t": 1.0}, ref, 60.0), Run("ours", {"t": 0.5}, off, 40.0)])
    assert "| ours | t 0.500 | 40.0 | 3 | 2 | 1.00e-01 | 2 |" in text


def test_targets_are_name_equals_url() -> None:
    url = "http://127.0.0.1:8000/v1/completions"
    assert parse_target(f"vllm={url}") == ("vllm", url)
    for bad in ("vllm", "=http://x", "vllm=localhost:8000"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=URL"):
            parse_target(bad)


def test_the_default_task_reads_a_local_file_of_valid_docs() -> None:
    # lm-eval resolves data_files against its working directory: the bench runs it from the root.
    yaml_text = (TASKS_DIR / "capitals.yaml").read_text()
    assert "data_files:\n    test: bench/lm_eval/capitals.jsonl" in yaml_text
    assert "dataset_path: json" in yaml_text
    docs = [json.loads(line) for line in (ROOT / "bench/lm_eval/capitals.jsonl").read_text().splitlines()]
    assert len(docs) == 24
    for doc in docs:
        assert len(set(doc["choices"])) == 4 and 0 <= doc["answer"] < 4


def test_bench_lm_eval_help_parses_and_a_missing_lm_eval_is_said() -> None:
    r = subprocess.run([sys.executable, "-m", "semserve", "bench", "lm-eval", "--target",
                        "vllm=http://127.0.0.1:1/v1/completions", "--lm-eval", "/nonexistent/lm_eval"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "no lm_eval at '/nonexistent/lm_eval'" in r.stderr, r.stderr
