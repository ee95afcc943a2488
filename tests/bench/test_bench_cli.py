"""`semserve bench cache` is wired into the CLI (no servers started, nothing timed)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_bench_cache_help_parses() -> None:
    r = subprocess.run([sys.executable, "-m", "semserve", "bench", "cache", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--requests-hit" in r.stdout and "--skip-redisvl" in r.stdout


def test_bench_cache_module_imports() -> None:
    import bench.cache
    import bench.cache_report
    import bench.redisvl_peer

    assert bench.cache_report.GOAL_SEMANTIC_P50_MS == 5.0
    assert bench.redisvl_peer.DEFAULT_DISTANCE_THRESHOLD == 0.1


def test_bench_stream_help_parses() -> None:
    r = subprocess.run([sys.executable, "-m", "semserve", "bench", "stream", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--requests" in r.stdout and "--skip-vllm" in r.stdout and "--stream-interval" in r.stdout


def test_bench_stream_gives_every_server_the_same_stream_interval() -> None:
    from bench.stream import interval_args

    assert interval_args(1) == []  # vLLM's default: no flag, so a vLLM without it runs too
    assert interval_args(8) == ["--stream-interval", "8"]


def test_bench_stream_levels_and_ratios() -> None:
    from bench.stream import Sample, make_plan, parse_levels, ratios, sample_of, summarize, waves

    assert parse_levels("1,8,32", "16,32,64") == ([1, 8, 32], [16, 32, 64])
    assert parse_levels("1,8", "0") == ([1, 8], [8, 32])  # 0: 4 x concurrency, at least 8
    plan = make_plan([1, 8], [4, 16], seed=0)
    prompts = plan.transformer[8] + plan.direct[8] + plan.transformer[1] + plan.direct[1]
    assert len(set(prompts)) == len(prompts) == 40  # every request a new prompt: a real miss
    assert [len(w) for w in waves(plan.direct[8], 8)] == [8, 8]

    # 5 tokens in 3 chunks: TTFT to the first content chunk, ITL per token after the first.
    s = sample_of(10.0, [10.1, 10.2, 10.5], tokens=5)
    assert abs(s.ttft_ms - 100.0) < 1e-6 and abs(s.itl_ms - 100.0) < 1e-6 and s.chunks == 3

    ours = summarize([Sample(110.0, 21.0, 64, 64)])
    ref = summarize([Sample(100.0, 20.0, 64, 64)])
    r = ratios(ours, ref)
    assert abs(r.ttft_p50 - 1.10) < 1e-9 and abs(r.ttft_added_ms - 10.0) < 1e-9
    assert abs(r.itl_p50 - 1.05) < 1e-9 and r.meets_goals
    assert not ratios(summarize([Sample(111.0, 20.0, 64, 64)]), ref).meets_goals


def test_bench_scale_help_parses() -> None:
    r = subprocess.run([sys.executable, "-m", "semserve", "bench", "scale", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--entries" in r.stdout and "--tenants" in r.stdout and "--ef-runtime" in r.stdout


def test_pair_judges_served_at_budget() -> None:
    import numpy as np

    from bench.pair_judges import served_at_budget

    scores = np.array([0.9, 0.8, 0.7, 0.95, 0.6, 0.5, 0.4, 0.3])
    same = np.array([True, True, True, False, False, False, False, False])
    # 0 % of 5 look-alikes may pass: the cut is the highest look-alike (0.95), nothing is served.
    assert served_at_budget(scores, same, 0.0) == (0.95, 0.0)
    # 20 %: one look-alike may pass, the cut drops to the next one (0.6), every same pair is served.
    assert served_at_budget(scores, same, 0.2) == (0.6, 1.0)
    among = np.array([False, False, True, False, False, False, False, False])
    assert served_at_budget(scores, same, 0.2, among) == (0.6, 1.0)
    r = subprocess.run([sys.executable, "-m", "bench.pair_judges", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "cross-encoder" in r.stdout, r.stderr
