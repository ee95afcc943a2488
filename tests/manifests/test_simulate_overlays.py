"""`semserve simulate --overlay` simulates exactly what each Knative overlay deploys."""

from __future__ import annotations

import argparse
import json

import pytest

from serverless import cli
from tests.manifests.conftest import KNATIVE_OVERLAYS, MANIFESTS, kubectl


def _simulate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="semserve")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", *argv])
    return int(args.func(args))


@pytest.mark.parametrize("overlay", KNATIVE_OVERLAYS)
@pytest.mark.parametrize("component", ["predictor", "transformer"])
def test_simulate_overlay(overlay: str, component: str, capsys: pytest.CaptureFixture[str]) -> None:
    kubectl()
    argv = [
        "--overlay",
        str(MANIFESTS / "overlays" / overlay),
        "--component",
        component,
        "--duration",
        "300",
        "--rate",
        "0.2",
        "--no-baselines",
        "--start",
        "idle",
        "--json",
    ]
    assert _simulate(argv) == 0
    data = json.loads(capsys.readouterr().out)
    s = data["settings"]
    assert s["name"] == "semserve" and "kubectl kustomize" in data["source"]
    if overlay.startswith("dev-tenant"):
        assert s["min_scale"] == 0 and s["max_scale"] == 1
    if overlay == "prod" and component == "predictor":
        assert (s["min_scale"], s["max_scale"], s["activation_scale"]) == (2, 8, 3)
        assert s["target_value"] == pytest.approx(64 * 0.75)


def test_standard_overlay_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    kubectl()
    assert _simulate(["--overlay", str(MANIFESTS / "overlays" / "standard"), "--duration", "10"]) == 2
    assert "deploymentMode" in capsys.readouterr().err
