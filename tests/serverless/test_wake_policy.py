"""`python -m bench.wake_policies` (serverless/wake_policy.py): the three wake policies on a short trace,
run as a user runs it; the table's shape, the CPU refusal, and scale to sleep between the other two."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from serverless.wake_policy import Served, apply_sleep
from tests.support import ROOT


def _seconds(cell: str) -> float:
    return float(cell.split()[0].replace(",", ""))


def test_command_table_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "policies.png"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.wake_policies", "--duration", "3600", "--seed", "3", "--png", str(png)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    header, rows = lines[0], [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert "miss wait p50 / p99 (s)" in header and "hit wait p50 / p99 (s)" in header
    assert len(rows) == 2 * 2 * 3 and all(len(r) == 10 for r in rows)
    table = {(r[0], r[1], r[2]): r for r in rows}
    for tenant in ("dev (sporadic)", "prod (bursty)"):
        assert "no sleep mode" in table[("cpu (measured)", tenant, "scale to sleep")][4]
        zero, sleep, warm = (table[("gpu (published)", tenant, p)]
                             for p in ("scale to zero", "scale to sleep", "min-scale 1"))  # fmt: skip
        p99 = [float(r[7].split("/")[1]) for r in (warm, sleep, zero)]
        assert p99[0] <= p99[1] < p99[2], (tenant, p99)
        assert int(sleep[8]) > 0  # it slept and woke
        # The sleeping pod keeps its GPU allocated but not awake.
        assert _seconds(sleep[4]) == _seconds(warm[4]) and _seconds(sleep[5]) < _seconds(sleep[4])
        assert _seconds(zero[4]) < _seconds(warm[4])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "vLLM's sleep-mode blog post" in proc.stdout and "bench/RESULTS.md" in proc.stdout


# (arrivals and ends of the predictor's requests, idle window) -> (delays, seconds asleep, wakes)
CASES = [
    ([(10, 12)], 60, [0.0], 28.0, 0),  # asleep from 72 to the end (100)
    ([(70, 71)], 60, [1.0], 10.0, 1),  # asleep 60..70, woken at 70 for 1 s
    ([(70, 71), (70.5, 72)], 60, [1.0, 0.5], 10.0, 1),  # the second waits for the same wake
    ([(30, 40), (95, 96)], 60, [0.0, 0.0], 0.0, 0),  # 55 s idle: never slept
]


@pytest.mark.parametrize(("spans", "idle", "delays", "asleep", "wakes"), CASES)
def test_apply_sleep(spans: list[tuple[float, float]], idle: float, delays: list[float], asleep: float,
                     wakes: int) -> None:  # fmt: skip
    served = [Served(i, a, a + 0.1, d) for i, (a, d) in enumerate(spans)]
    got = apply_sleep(served, idle, (1.0, 1.0), 100.0, random.Random(0))
    assert [round(got.delays[i], 3) for i in range(len(spans))] == delays
    assert got.wakes == wakes
    assert got.asleep_s == pytest.approx(asleep)
