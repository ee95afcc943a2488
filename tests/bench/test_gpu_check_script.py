"""bench/gpu-check.sh cannot run here (no GPU); check it parses and only uses commands that exist."""

from __future__ import annotations

import subprocess
from pathlib import Path

from semserve.cli import build_parser

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu-check.sh"


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_bench_command_it_runs_exists() -> None:
    args = build_parser().parse_args(
        ["bench", "predictor", "--model", "/tmp/m", "--concurrency", "1,32,128", "--max-tokens", "128",
         "--output", "bench/RESULTS.md", "--profile", "bench/gpu-profile.json"]
    )
    assert args.concurrency == "1,32,128"
