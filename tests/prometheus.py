"""Helpers for the tests that run Debian's Prometheus and promtool (installed by `make test`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT

ALERTS = ROOT / "manifests" / "base" / "alerts.yaml"
DASHBOARD = ROOT / "manifests" / "base" / "dashboard.yaml"


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        # Not a skip: these tests are how the rules and the dashboard are known to work.
        pytest.fail(f"{name} not found: `make test` installs Debian's prometheus package (apt-get)")
    return found


def rule_groups(interval_s: float | None = None) -> list[dict[str, Any]]:
    """The PrometheusRule's groups, as a plain Prometheus rules file holds them; `interval_s`
    overrides every group's interval (a live test cannot wait 30 s per evaluation)."""
    groups = yaml.safe_load(ALERTS.read_text())["spec"]["groups"]
    if interval_s is not None:
        for g in groups:
            g["interval"] = f"{interval_s:g}s"
    return groups


def write_rules(path: Path, interval_s: float | None = None) -> Path:
    path.write_text(yaml.safe_dump({"groups": rule_groups(interval_s)}, sort_keys=False))
    return path


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def dashboard_queries(namespace: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, its variables filled in. The
    namespace variable's Grafana query `label_values(m, namespace)` becomes `count by (namespace) (m)`."""
    doc = yaml.safe_load(DASHBOARD.read_text())
    board = json.loads(doc["data"]["semserve.json"])
    out: list[tuple[str, str]] = []
    for var in board["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", str(var.get("query", "")))
        if m:
            out.append((f"variable {var['name']}", f"count by ({m[2]}) ({m[1]})"))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$namespace", namespace)
            out.append((f"{panel['title']} [{target['refId']}]", expr))
    return out
