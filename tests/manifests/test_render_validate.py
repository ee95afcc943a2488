"""Every kustomize directory renders with kubectl kustomize, and every object validates strictly."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from serverless import kustomize
from serverless import tenant_validate as tv
from tests.manifests.conftest import DIRS, MANIFESTS, OVERLAYS, by_kind

Docs = dict[str, list[dict[str, Any]]]


def test_overlays_exist() -> None:
    assert {"dev-tenant", "dev-tenant-cpu", "prod", "standard"} <= set(OVERLAYS)


@pytest.mark.parametrize("directory", DIRS)
def test_every_object_validates(directory: str, rendered: Docs, schemas: Any) -> None:
    docs = rendered[directory]
    assert docs, f"{directory} rendered nothing"
    assert tv.validate_objects(docs, schemas) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_renderer_matches_kubectl(overlay: str, rendered: Docs) -> None:
    # `semserve simulate --overlay` falls back to the built-in renderer without kubectl: it must
    # produce the very objects kubectl kustomize does.
    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    builtin = {key(d): d for d in kustomize.render_kustomization(MANIFESTS / "overlays" / overlay)}
    kubectl = {key(d): d for d in rendered[f"overlays/{overlay}"]}
    assert builtin == kubectl


def test_profiles_scale_as_documented(rendered: Docs) -> None:
    def isvc(overlay: str) -> dict[str, Any]:
        (one,) = by_kind(rendered[f"overlays/{overlay}"], "InferenceService")
        return one

    dev = isvc("dev-tenant")["spec"]
    assert dev["predictor"]["minReplicas"] == 0 and dev["transformer"]["minReplicas"] == 0
    assert dev["predictor"]["maxReplicas"] == 1
    cpu = isvc("dev-tenant-cpu")["spec"]["predictor"]["model"]
    assert cpu["runtime"] == "semserve-predictor-cpu" and "nvidia.com/gpu" not in str(cpu["resources"])
    prod = isvc("prod")["spec"]["predictor"]
    assert prod["minReplicas"] >= 1 and "autoscaling.knative.dev/activation-scale" in prod["annotations"]
    assert len(by_kind(rendered["overlays/prod"], "PodDisruptionBudget")) == 2
    std = isvc("standard")
    assert std["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    queries = [m["external"]["metric"]["query"] for m in std["spec"]["predictor"]["autoScaling"]["metrics"]]
    assert "vllm:num_requests_waiting" in queries
    assert {p["containerPort"] for p in std["spec"]["predictor"]["model"]["ports"]} == {8080, 8081}
    for overlay in ("dev-tenant", "prod"):
        ports = isvc(overlay)["spec"]["predictor"]["model"]["ports"]
        assert ports == [{"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]
    assert by_kind(rendered["redis"], "StatefulSet")[0]["spec"]["volumeClaimTemplates"]


# --- Negative cases: each fails with a line naming the object and the field ---------------------


def _isvc(rendered: Docs) -> dict[str, Any]:
    return copy.deepcopy(by_kind(rendered["overlays/dev-tenant"], "InferenceService")[0])


def test_typo_field_fails(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["spec"]["predictor"]["minReplica"] = doc["spec"]["predictor"].pop("minReplicas")
    errors = tv.validate_objects([doc], schemas)
    assert "InferenceService/semserve: spec.predictor.minReplica: unknown field" in errors


def test_typo_in_nested_container_and_core_kind(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["spec"]["transformer"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    (svc,) = [
        copy.deepcopy(d)
        for d in by_kind(rendered["redis"], "Service")
        if d["metadata"]["name"] == "semserve-redis"
    ]
    svc["spec"]["ports"][0]["targetPorts"] = 6379
    errors = tv.validate_objects([doc, svc], schemas)
    assert (
        "InferenceService/semserve: spec.transformer.containers[0].readinessProbe.httpGett: unknown field"
        in errors
    )
    assert "Service/semserve-redis: spec.ports[0].targetPorts: unknown field" in errors


def test_min_greater_than_max_fails(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["spec"]["predictor"]["minReplicas"] = 3
    errors = tv.validate_objects([doc], schemas)
    assert any(
        e.startswith("InferenceService/semserve: spec.predictor.minReplicas: 3 is greater than maxReplicas 1")
        for e in errors
    ), errors


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("autoscaling.knative.dev/window", "2h", "window"),
        ("autoscaling.knative.dev/target-utilization-percentage", "150", "target-utilization-percentage"),
        ("autoscaling.knative.dev/scale-to-zero-pod-retention-period", "2h", "retention"),
        ("autoscaling.knative.dev/panic-threshold-percentage", "50", "panic-threshold-percentage"),
        ("autoscaling.knative.dev/activation-scale", "1", "activation-scale"),
    ],
)
def test_out_of_range_annotation_fails(
    rendered: Docs, schemas: Any, key: str, value: str, words: str
) -> None:
    doc = _isvc(rendered)
    doc["spec"]["predictor"]["annotations"][key] = value
    errors = tv.validate_objects([doc], schemas)
    assert len(errors) == 1 and errors[0].startswith("InferenceService/semserve: spec.predictor"), errors
    assert words in errors[0]


def test_wrong_scale_metric_fails(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["spec"]["predictor"]["scaleMetric"] = "cpu"  # valid enum, wrong for the KPA
    errors = tv.validate_objects([doc], schemas)
    assert errors == [
        "InferenceService/semserve: spec.predictor.scaleMetric: 'cpu' is not supported by the "
        "Knative KPA (concurrency or rps)"
    ]
    doc["spec"]["predictor"]["scaleMetric"] = "gpu"  # not even in the CRD's enum
    assert any(
        "spec.predictor.scaleMetric" in e and "'gpu' is not one of" in e
        for e in tv.validate_objects([doc], schemas)
    )


def test_knative_rules_beyond_the_schema(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["spec"]["predictor"]["model"]["ports"].append({"name": "http1", "containerPort": 8080})
    doc["spec"]["transformer"]["containers"][0]["ports"][0]["name"] = "grpc"
    doc["spec"]["predictor"]["deploymentStrategy"] = {"type": "Recreate"}
    doc["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] = "1"
    errors = "\n".join(tv.validate_objects([doc], schemas))
    assert "spec.predictor.model.ports: Knative allows one port per container" in errors
    assert "spec.transformer.containers[0].ports[0].name: 'grpc' must be h2c" in errors
    assert "spec.predictor.deploymentStrategy: only allowed in Standard mode" in errors
    assert "autoscaling.knative.dev/min-scale: KServe drops this annotation" in errors


def test_standard_mode_rules(rendered: Docs, schemas: Any) -> None:
    (doc,) = copy.deepcopy(by_kind(rendered["overlays/standard"], "InferenceService"))
    doc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] = "hpa"
    doc["spec"]["predictor"]["annotations"] = {"autoscaling.knative.dev/window": "60s"}
    errors = "\n".join(tv.validate_objects([doc], schemas))
    assert (
        "spec.predictor.autoScaling.metrics[0].type: 'External' needs serving.kserve.io/autoscalerClass: keda"
        in errors
    )
    assert "spec.predictor.annotations: ['autoscaling.knative.dev/window'] need Knative mode" in errors
    doc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] = "kpa"
    assert any("autoscalerClass: 'kpa' is not one of" in e for e in tv.validate_objects([doc], schemas))


def test_crd_typo_in_monitoring_kinds(rendered: Docs, schemas: Any) -> None:
    docs = copy.deepcopy(rendered["base"])
    (pm,) = [d for d in docs if d["metadata"]["name"] == "semserve-predictor" and d["kind"] == "PodMonitor"]
    pm["spec"]["podMetricsEndpoint"] = pm["spec"].pop("podMetricsEndpoints")
    (rule,) = by_kind(docs, "PrometheusRule")
    rule["spec"]["groups"][1]["rules"][0]["expresion"] = "up"
    errors = tv.validate_objects([pm, rule], schemas)
    assert "PodMonitor/semserve-predictor: spec.podMetricsEndpoint: unknown field" in errors
    assert "PrometheusRule/semserve: spec.groups[1].rules[0].expresion: unknown field" in errors


def test_unquoted_annotation_value_fails(rendered: Docs, schemas: Any) -> None:
    doc = _isvc(rendered)
    doc["metadata"]["annotations"]["serving.knative.dev/progress-deadline"] = 1800
    assert any(
        "metadata.annotations.serving.knative.dev/progress-deadline: must be a string" in e
        for e in tv.validate_objects([doc], schemas)
    )
