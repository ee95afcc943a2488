"""`semserve simulate`: summary table, PNG and JSON from a manifest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from semserve import cli as semserve_cli
from serverless import cli

FIX = Path(__file__).parent / "fixtures"


def _run(argv: list[str]) -> int:
    # Our subcommand alone: the full `semserve` parser also imports the other services' modules.
    parser = argparse.ArgumentParser(prog="semserve")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *argv])
    return int(args.func(args))


def test_registered_in_semserve() -> None:
    assert "serverless.cli" in semserve_cli.COMMAND_MODULES


def test_summary_png_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, js = tmp_path / "dev.png", tmp_path / "dev.json"
    argv = ["--isvc", str(FIX / "dev-tenant.yaml"), "--traffic", "sporadic", "--mean-gap", "120",
            "--duration", "900", "--hit-ratio", "0.3", "--start", "idle", "--seed", "3",
            "--plot", str(png), "--json", str(js)]  # fmt: skip
    assert _run(argv) == 0
    out = capsys.readouterr().out
    for label in ("requests", "served", "timed out", "latency p50", "latency p99", "cold starts", "peak pods",
                  "pod-seconds", "saved by the cache", "saved by scale-to-zero"):  # fmt: skip
        assert label in out
    # The default profile is the CPU one: its pods hold no GPU. Sporadic traffic has no rate.
    assert "GPU-seconds" not in out
    assert "one request every 120s on average" in out and "@ 1/s" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["settings"]["min_scale"] == 0 and data["seed"] == 3
    keys = {"requests", "served", "timed_out", "latency_p99_s", "cold_starts", "peak_pods", "gpu_seconds"}
    keys |= {"gpu_seconds_saved_by_cache", "gpu_seconds_saved_by_scale_to_zero"}
    assert keys <= set(data["summary"])
    assert len(data["series"]["t"]) == 900
    # Same seed, same answer.
    js2 = tmp_path / "again.json"
    assert _run([*argv[:-4], "--json", str(js2)]) == 0
    assert json.loads(js2.read_text())["summary"] == data["summary"]


def test_json_to_stdout_and_overlay(capsys: pytest.CaptureFixture[str]) -> None:
    overlay = FIX / "kustomize" / "overlays" / "dev"
    assert (
        _run(["--overlay", str(overlay), "--duration", "120", "--rate", "0.2", "--no-baselines", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["name"] == "dev-semserve" and data["settings"]["stable_window"] == 30.0


def test_trace_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,prompt_id,tenant,hit\n0,a,dev,0\n1.5,b,dev,1\n3,c,prod,0\n")
    argv = ["--trace", str(trace), "--tenant", "dev", "--set", "minReplicas=0", "--start", "idle", "--json"]
    assert _run(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["requests"] == 2 and data["summary"]["cache_hits"] == 1


def test_bad_manifest_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--isvc", str(FIX / "standard.yaml"), "--duration", "10"]) == 2
    assert "deploymentMode" in capsys.readouterr().err


def test_gpu_profile_reports_gpu_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--isvc", str(FIX / "dev-tenant.yaml"), "--traffic", "steady", "--rate", "0.5",
            "--duration", "300", "--profile", "gpu", "--no-baselines"]  # fmt: skip
    assert _run(argv) == 0
    out = capsys.readouterr().out
    assert "GPU-seconds" in out and "pod-seconds" not in out
    assert "steady @ 0.5/s" in out
