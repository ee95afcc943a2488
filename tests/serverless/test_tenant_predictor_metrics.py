"""Fair admission's view of the predictor on Kubernetes: the transformer's --predictor-metrics-url
(env SEMSERVE_TRANSFORMER_PREDICTOR_METRICS_URL) names the tenant's own Service NAME-predictor-metrics,
which selects that tenant's predictor pods on the port they serve /metrics on (8080, the probes'
port), and the NetworkPolicy lets the transformer reach it. Neither Knative's route (gRPC only) nor
KServe's Standard Service (8080 published as 80) would, so the fair queue would read nothing and
admit every miss. Checked on what `semserve tenant create` renders for every profile."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from serverless import tenant_objects as objects
from transformers_svc.config import TransformerSettings

METRICS_ENV = "SEMSERVE_TRANSFORMER_PREDICTOR_METRICS_URL"


def _expand(value: str, env: dict[str, str]) -> str:
    # What the kubelet does with $(VAR) in an env value (VAR defined earlier in the list).
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


@pytest.mark.parametrize("profile", list(objects.PROFILES))
def test_the_metrics_url_reaches_the_tenants_predictor(profile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = objects.tenant_objects(profile, "alice", "team")
    (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
    transformer = isvc["spec"]["transformer"]["containers"][0]
    # The downward API values of ISVC_NAME and POD_NAMESPACE in this tenant's pods.
    env = {"ISVC_NAME": "alice", "POD_NAMESPACE": "team"}
    names = [e["name"] for e in transformer["env"]]
    assert names.index(METRICS_ENV) > max(names.index("ISVC_NAME"), names.index("POD_NAMESPACE"))
    (raw,) = [e["value"] for e in transformer["env"] if e["name"] == METRICS_ENV]
    url = urlsplit(_expand(raw, env))
    assert url.scheme == "http" and url.path == "/metrics"
    service_name, namespace = str(url.hostname).split(".")
    assert (service_name, namespace) == ("alice-predictor-metrics", "team")
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service_name]
    assert svc["metadata"]["labels"][objects.TENANT_LABEL] == "alice"
    assert svc["spec"]["selector"] == {objects.ISVC_LABEL: "alice", "component": "predictor"}
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    # The predictor serves /metrics where its probes find it: the HTTP port.
    model = isvc["spec"]["predictor"]["model"]
    assert port["targetPort"] == model["readinessProbe"]["httpGet"]["port"] == 8080
    # The NetworkPolicy lets transformer pods in on that port.
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"
                 and d["spec"]["podSelector"]["matchLabels"] == {"component": "predictor"}]  # fmt: skip
    from_transformer = [
        rule for rule in policy["spec"]["ingress"]
        if any((f.get("podSelector") or {}).get("matchLabels") == {"component": "transformer"}
               for f in rule["from"])
    ]  # fmt: skip
    assert any(p["port"] == port["targetPort"] for rule in from_transformer for p in rule["ports"])
    # The transformer takes the value as its setting.
    monkeypatch.setenv(METRICS_ENV, url.geturl())
    assert TransformerSettings.from_env().predictor_metrics_url == url.geturl()


def test_delete_takes_the_service_with_the_tenant() -> None:
    docs = objects.tenant_objects("dev", "bob", "ns")
    mine = {(d["kind"], d["metadata"]["name"]) for d in docs if objects.per_tenant(d)}
    assert ("Service", "bob-predictor-metrics") in mine and ("Service", "semserve-redis") not in mine
