"""The lever bench's report: a start that wrote to the compile cache compiled, so it is not a warm
start; it is marked and left out of the medians while its subject has a warm one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from bench.startup_levers import Levers, Trial, cache_files, warm_or_all


def _levers(trials: list[Trial]) -> Levers:
    levers = Levers.__new__(Levers)  # the report needs no bench: no model, no scratch directory
    levers.args = SimpleNamespace(predictor_runs=2)
    levers.variants = []
    levers.trials = trials
    return levers


def test_cache_files_counts_what_a_start_adds(tmp_path: Path) -> None:
    (tmp_path / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (tmp_path / "vllm" / "torch_compile_cache" / "a.so").write_bytes(b"x")
    before = cache_files(tmp_path)
    (tmp_path / "torchinductor").mkdir()
    (tmp_path / "torchinductor" / "b.cpp").write_text("k")
    (tmp_path / "torchinductor" / "c.so").write_bytes(b"y")
    assert (before, cache_files(tmp_path)) == (1, 3)


def test_warm_or_all_keeps_the_warm_starts_else_all() -> None:
    cold = Trial("vllm", 0, 142.4, True, cache_writes=12)
    warm = Trial("vllm", 1, 68.1, True)
    assert warm_or_all([cold, warm]) == [warm]
    assert warm_or_all([cold]) == [cold]


def test_report_leaves_a_compiling_start_out_of_the_median_and_marks_it() -> None:
    trials = [
        Trial("vllm", 0, 142.4, True, tokens_per_s=50.0, cache_writes=12),
        Trial("baseline", 0, 25.3, True, tokens_per_s=130.0),
        Trial("vllm", 1, 68.1, True, tokens_per_s=70.0),
        Trial("baseline", 1, 18.1, True, tokens_per_s=120.0),
    ]
    report = _levers(trials).report()
    vllm_row = next(line for line in report.splitlines() if line.startswith("| vllm |"))
    base_row = next(line for line in report.splitlines() if line.startswith("| baseline |"))
    # vLLM's median is its warm start alone (68.1), not the mean of 142.4 and 68.1.
    assert vllm_row.startswith("| vllm | 1 | 68.10 (142.4* (12 files), 68.1) | 1.00x | 70.00 |")
    assert base_row.startswith("| baseline | 2 | 21.70 (25.3, 18.1) | 0.32x | 125.00 | 1.79x |")
    assert "(*) the start wrote files to the compile cache" in report


def test_report_without_a_compiling_start_has_no_mark() -> None:
    trials = [Trial("vllm", 0, 60.0, True), Trial("baseline", 0, 20.0, True)]
    report = _levers(trials).report()
    rows = [line for line in report.splitlines() if line.startswith(("| vllm | 1 |", "| baseline | 1 |"))]
    assert rows == [
        "| vllm | 1 | 60.00 (60.0) | 1.00x | - | - | - | - |",
        "| baseline | 1 | 20.00 (20.0) | 0.33x | - | - | - | - |",
    ]
    assert "(*)" not in report
