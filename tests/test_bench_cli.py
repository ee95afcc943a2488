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
    import bench.redisvl_peer

    assert bench.cache.GOAL_SEMANTIC_P50_MS == 5.0
    assert bench.redisvl_peer.DEFAULT_DISTANCE_THRESHOLD == 0.1
