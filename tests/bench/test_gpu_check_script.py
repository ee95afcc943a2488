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
        [
            "bench",
            "predictor",
            "--model",
            "/tmp/m",
            "--concurrency",
            "1,32,128",
            "--max-tokens",
            "128",
            "--output",
            "bench/RESULTS.md",
            "--profile",
            "bench/gpu-profile.json",
        ]
    )
    assert args.concurrency == "1,32,128"


def test_an_unknown_step_is_refused_before_anything_runs() -> None:
    out = subprocess.run(["bash", str(SCRIPT), "sleeep"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "unknown step 'sleeep': all, model, sleep or bench" in out.stdout


def test_without_a_gpu_it_stops_at_the_machine_check(tmp_path: Path) -> None:
    # Here nvidia-smi is absent: the check says so and exits 2 instead of failing later.
    out = subprocess.run(["bash", str(SCRIPT), "sleep"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SEMSERVE_GPU_CHECK_DIR": str(tmp_path)})  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no NVIDIA GPU visible" in out.stdout
