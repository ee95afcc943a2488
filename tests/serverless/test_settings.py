"""Settings from InferenceService manifests: KServe fields, Knative annotations, defaults, bounds."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from serverless import kustomize
from serverless import settings_from_manifest as sfm

FIX = Path(__file__).parent / "fixtures"


def _load(name: str) -> tuple[dict[str, Any], dict[str, str] | None]:
    docs = kustomize.load_documents((FIX / name).read_text())
    return sfm.pick_inferenceservice(docs), sfm.cluster_config_from(docs)


def _isvc(
    predictor: dict[str, Any] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "kind": "InferenceService",
        "metadata": {"name": "t", "annotations": annotations or {}},
        "spec": {"predictor": predictor or {}},
    }


def test_defaults_are_knatives_and_kserves() -> None:
    s = sfm.settings_from_inferenceservice(_isvc())
    assert s.min_scale == 1  # KServe's DefaultMinReplicas when minReplicas is absent
    assert (s.max_scale, s.initial_scale, s.container_concurrency) == (0, 1, 0)
    assert (s.target_value, s.total_value) == (pytest.approx(70.0), 100.0)  # 100 * 0.7
    assert (s.stable_window, s.panic_window, s.panic_threshold_percentage) == (60.0, 6.0, 200.0)
    assert s.target_burst_capacity == 211.0
    assert (s.max_scale_up_rate, s.max_scale_down_rate) == (1000.0, 2.0)
    assert (s.scale_to_zero_grace_period, s.scale_to_zero_pod_retention_period) == (30.0, 0.0)
    assert s.timeout_s == 300.0
    d = s.decider_spec()
    assert d.panic_threshold == 2.0 and d.target_value == pytest.approx(70.0)


def test_dev_tenant_fixture() -> None:
    isvc, cluster = _load("dev-tenant.yaml")
    s = sfm.settings_from_inferenceservice(isvc, cluster_config=cluster)
    assert s.name == "semserve-dev"
    assert (s.min_scale, s.max_scale, s.container_concurrency, s.timeout_s) == (0, 1, 8, 180.0)
    # scaleTarget 4 <= containerConcurrency 8: total 4, target 4 * 0.7
    assert s.total_value == 4.0 and s.target_value == pytest.approx(2.8)
    assert s.scale_to_zero_pod_retention_period == 300.0
    assert s.target_burst_capacity == 0.0
    assert s.sources["target"] == "predictor.scaleTarget"
    assert s.gpus_per_pod == 1.0


def test_prod_fixture_with_cluster_configmap() -> None:
    isvc, cluster = _load("prod.yaml")
    s = sfm.settings_from_inferenceservice(isvc, cluster_config=cluster)
    assert (s.min_scale, s.max_scale, s.initial_scale, s.activation_scale) == (2, 8, 3, 2)
    assert s.target_value == pytest.approx(32 * 0.8)  # CC 32, ISVC-level utilization 80%
    assert (s.stable_window, s.panic_window, s.panic_threshold_percentage) == (120.0, 6.0, 150.0)
    assert s.scale_down_delay == 120.0
    assert s.scale_to_zero_grace_period == 45.0 and s.max_scale_up_rate == 4.0
    assert s.sources["max-scale-up-rate"] == "config-autoscaler"


def test_annotation_target_capped_by_container_concurrency() -> None:
    s = sfm.settings_from_inferenceservice(
        _isvc({"containerConcurrency": 10}, {"autoscaling.knative.dev/target": "50"})
    )
    assert s.total_value == 10.0  # ResolveMetricTarget: min(annotation, CC)


def test_component_annotations_win_and_legacy_keys() -> None:
    s = sfm.settings_from_inferenceservice(
        _isvc(
            {"annotations": {"autoscaling.knative.dev/window": "90s"}},
            {"autoscaling.knative.dev/window": "30s", "autoscaling.knative.dev/initialScale": "2"},
        )
    )
    assert s.stable_window == 90.0 and s.initial_scale == 2


def test_rps_metric() -> None:
    s = sfm.settings_from_inferenceservice(_isvc({"scaleMetric": "rps"}))
    assert s.metric == "rps" and s.total_value == 200.0 and s.target_value == pytest.approx(140.0)


def test_min_max_annotations_are_dropped_with_a_warning() -> None:
    s = sfm.settings_from_inferenceservice(
        _isvc({"minReplicas": 0}, {"autoscaling.knative.dev/min-scale": "3"})
    )
    assert s.min_scale == 0 and any("min-scale" in w for w in s.warnings)


def test_initial_scale_zero_needs_cluster_permission() -> None:
    ann = {"autoscaling.knative.dev/initial-scale": "0"}
    s = sfm.settings_from_inferenceservice(_isvc({"minReplicas": 0}, ann))
    assert s.initial_scale == 1 and s.warnings
    s = sfm.settings_from_inferenceservice(
        _isvc({"minReplicas": 0}, ann), cluster_config={"allow-zero-initial-scale": "true"}
    )
    assert s.initial_scale == 0


@pytest.mark.parametrize(
    ("predictor", "annotations", "field"),
    [
        ({}, {"autoscaling.knative.dev/window": "5s"}, "autoscaling.knative.dev/window"),
        ({}, {"autoscaling.knative.dev/window": "61.5s"}, "autoscaling.knative.dev/window"),
        ({}, {"autoscaling.knative.dev/window": "soon"}, "autoscaling.knative.dev/window"),
        ({}, {"autoscaling.knative.dev/panic-threshold-percentage": "100"}, "panic-threshold-percentage"),
        ({}, {"autoscaling.knative.dev/panic-window-percentage": "0.5"}, "panic-window-percentage"),
        (
            {},
            {"autoscaling.knative.dev/target-utilization-percentage": "120"},
            "target-utilization-percentage",
        ),
        ({}, {"autoscaling.knative.dev/target-burst-capacity": "-2"}, "target-burst-capacity"),
        ({}, {"autoscaling.knative.dev/target": "0.001"}, "autoscaling.knative.dev/target"),
        ({}, {"autoscaling.knative.dev/activation-scale": "1"}, "activation-scale"),
        ({"minReplicas": 3}, {"autoscaling.knative.dev/activation-scale": "2"}, "activation-scale"),
        (
            {"maxReplicas": 1, "minReplicas": 0},
            {"autoscaling.knative.dev/activation-scale": "2"},
            "activation-scale",
        ),
        ({}, {"autoscaling.knative.dev/max-scale-down-rate": "1"}, "max-scale-down-rate"),
        ({}, {"autoscaling.knative.dev/scale-down-delay": "2h"}, "scale-down-delay"),
        ({}, {"autoscaling.knative.dev/scale-to-zero-pod-retention-period": "-1s"}, "retention-period"),
        ({"minReplicas": 3, "maxReplicas": 2}, {}, "minReplicas"),
        ({"minReplicas": -1}, {}, "minReplicas"),
        ({"containerConcurrency": -1}, {}, "containerConcurrency"),
        ({"scaleMetric": "cpu"}, {}, "scaleMetric"),
        ({"scaleMetric": "rps", "scaleTarget": 0.5}, {}, "scaleTarget"),
        ({"timeout": 0}, {}, "timeout"),
        ({}, {"autoscaling.knative.dev/class": "hpa.autoscaling.knative.dev"}, "class"),
    ],
)
def test_validation_names_the_field(
    predictor: dict[str, Any], annotations: dict[str, str], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        sfm.settings_from_inferenceservice(_isvc(predictor, annotations))


def test_standard_mode_is_refused() -> None:
    isvc, _ = _load("standard.yaml")
    with pytest.raises(ValueError, match="deploymentMode"):
        sfm.settings_from_inferenceservice(isvc)


def test_missing_component() -> None:
    with pytest.raises(ValueError, match=r"spec\.transformer"):
        sfm.settings_from_inferenceservice(_isvc(), "transformer")


@pytest.mark.parametrize(
    ("text", "want"), [("60s", 60), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600), ("45", 45)]
)
def test_parse_duration(text: str, want: float) -> None:
    assert sfm.parse_duration(text, "x") == want


def test_builtin_kustomize_renderer() -> None:
    docs = kustomize.render_kustomization(FIX / "kustomize" / "overlays" / "dev")
    isvc = sfm.pick_inferenceservice(docs)
    assert isvc["metadata"]["name"] == "dev-semserve" and isvc["metadata"]["namespace"] == "tenant-dev"
    s = sfm.settings_from_inferenceservice(isvc)
    assert (s.min_scale, s.max_scale, s.container_concurrency, s.stable_window) == (0, 2, 16, 30.0)


@pytest.mark.skipif(
    kustomize.kubectl_binary() is None and not shutil.which("kustomize"), reason="no kustomize"
)
def test_render_overlay_agrees_with_kustomize() -> None:
    overlay = FIX / "kustomize" / "overlays" / "dev"
    rendered = kustomize.render_overlay(overlay)
    assert "kustomize" in rendered.how
    builtin = kustomize.render_kustomization(overlay)
    assert sfm.pick_inferenceservice(rendered.documents) == sfm.pick_inferenceservice(builtin)


def test_overrides() -> None:
    isvc = sfm.apply_overrides(_isvc(), "predictor", ["minReplicas=0", "autoscaling.knative.dev/window=120s"])
    s = sfm.settings_from_inferenceservice(isvc)
    assert s.min_scale == 0 and s.stable_window == 120.0
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sfm.apply_overrides(_isvc(), "predictor", ["oops"])
