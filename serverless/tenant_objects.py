"""A tenant's objects: the overlay that `semserve tenant create` renders, retargeted to one tenant, and
the labels, annotations and env that name the tenant and its model revision.

One source of truth: `create` renders the same kustomize overlay that `kubectl apply -k
manifests/overlays/<profile>` deploys (serverless/kustomize.py) and changes only identity: the
namespace, the InferenceService's name (the tenant's name), the selectors that name it (PDBs), a
tenant label, and optionally the model's storageUri.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import yaml

from serverless import kustomize
from serverless.tenant_limits_config import BASE_CONFIGMAP, configmap_name, is_limits_configmap

ROOT = Path(__file__).resolve().parent.parent

BASE_NAME = "semserve"  # the InferenceService's name in manifests/base
ISVC_LABEL = "serving.kserve.io/inferenceservice"
TENANT_LABEL = "semserve.io/tenant"
PROFILE_LABEL = "semserve.io/profile"
PROFILES = {"dev": "dev-tenant", "dev-cpu": "dev-tenant-cpu", "prod": "prod", "standard": "standard"}
COMPONENTS = ("predictor", "transformer")

ISVC_API = "serving.kserve.io/v1beta1"
PA_API = "autoscaling.internal.knative.dev/v1alpha1"
KNATIVE_API = "serving.knative.dev/v1"
# Rollout bookkeeping lives on the InferenceService itself, so any client (or a person with kubectl)
# sees which model revision serves and which one a rollback returns to.
REVISION_ANN = "semserve.io/model-revision"
PREVIOUS_REVISION_ANN = "semserve.io/previous-model-revision"
ROLLOUT_ANN = "semserve.io/rollout"  # canary | promoted | rolled-back
CACHE_EPOCH_ANN = "semserve.io/cache-epoch"
TAG_ROUTING_ANN = "serving.kserve.io/enable-tag-routing"
REVISION_ENV = "SEMSERVE_TRANSFORMER_EXPECTED_MODEL_REVISION"
# The revision the predictor reports with each answer: a transformer keyed by another revision (the
# stable one, whose misses reach the canary predictor through the split route) does not cache it.
PREDICTOR_REVISION_ENV = "SEMSERVE_PREDICTOR_MODEL_REVISION"
EPOCH_ENV = "SEMSERVE_CACHE_EPOCH"
# The transformer's predictor address (manifests/base): the component's route, split by the
# predictor's canaryTrafficPercent; during a canary the canary transformer calls the `latest-` tag
# route instead (KServe tag routing), so what it caches under the new revision comes from the new
# model only.
PREDICTOR_HOST_FLAGS = ("--predictor_host=", "--predictor-host=")
STABLE_PREDICTOR_HOST = "$(ISVC_NAME)-predictor.$(POD_NAMESPACE):80"
CANARY_PREDICTOR_HOST = "latest-$(ISVC_NAME)-predictor.$(POD_NAMESPACE):80"
# Per-tenant kinds (named after the tenant), and the tenant's limits ConfigMap; everything else in
# an overlay is shared by the namespace's tenants (Redis, policies, monitors, runtimes, dashboard).
TENANT_KINDS = ("InferenceService", "PodDisruptionBudget")
# The Service fair admission reads the tenant's predictor metrics through (manifests/base).
METRICS_SERVICE = "semserve-predictor-metrics"


def is_metrics_service(doc: dict[str, Any]) -> bool:
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return doc.get("kind") == "Service" and labels.get("app.kubernetes.io/name") == METRICS_SERVICE


def per_tenant(doc: dict[str, Any]) -> bool:
    """An object that belongs to one tenant (named after it), not to the namespace."""
    return doc.get("kind") in TENANT_KINDS or is_limits_configmap(doc) or is_metrics_service(doc)


class TenantError(Exception):
    """One line for the user."""


def manifests_dir() -> Path:
    return Path(os.environ.get("SEMSERVE_MANIFESTS", ROOT / "manifests"))


def render_overlay(directory: Path) -> list[dict[str, Any]]:
    """The overlay's documents, rendered as `kubectl apply -k` would (serverless/kustomize.py)."""
    try:
        return kustomize.render_overlay(directory).documents
    except ValueError as e:
        raise TenantError(str(e)) from None


def tenant_objects(
    profile: str,
    name: str,
    namespace: str,
    *,
    model: str | None = None,
    revision: str | None = None,
    external_redis: bool = False,
    manifests: Path | None = None,
) -> list[dict[str, Any]]:
    """The overlay's objects for one tenant: identity, model and its revision label changed, nothing else."""
    if profile not in PROFILES:
        raise TenantError(f"--profile {profile!r}: choose one of {', '.join(PROFILES)}")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 45:
        # KServe derives <name>-predictor-<ns> hostnames and revision names from it.
        raise TenantError(f"tenant name {name!r}: lowercase letters, digits and '-', at most 45 characters")
    directory = (manifests or manifests_dir()) / "overlays" / PROFILES[profile]
    if not directory.is_dir():
        raise TenantError(f"{directory}: no such overlay (set SEMSERVE_MANIFESTS to the manifests/ dir)")
    docs = render_overlay(directory)
    out = []
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        labels = meta.setdefault("labels", {})
        if external_redis and labels.get("app.kubernetes.io/name") == "semserve-redis":
            continue
        meta["namespace"] = namespace
        kind = doc.get("kind")
        if per_tenant(doc):
            labels[TENANT_LABEL] = name
            labels[PROFILE_LABEL] = profile
        if kind == "InferenceService":
            meta["name"] = name
            _label_model(doc, model, revision)
            _retarget_limits(doc, name)
        elif is_limits_configmap(doc):
            meta["name"] = configmap_name(name)
        elif is_metrics_service(doc):
            meta["name"] = str(meta["name"]).replace(BASE_NAME, name, 1)
            sel = (doc.get("spec") or {}).get("selector") or {}
            if sel.get(ISVC_LABEL) == BASE_NAME:
                sel[ISVC_LABEL] = name
        elif kind == "PodDisruptionBudget":
            meta["name"] = str(meta["name"]).replace(BASE_NAME, name, 1)
            sel = (doc.get("spec") or {}).get("selector", {}).get("matchLabels", {})
            if sel.get(ISVC_LABEL) == BASE_NAME:
                sel[ISVC_LABEL] = name
        out.append(doc)
    return out


def _retarget_limits(isvc: dict[str, Any], name: str) -> None:
    # Each InferenceService reads its own limits ConfigMap (NAME-tenant-limits).
    for volume in (isvc["spec"].get("transformer") or {}).get("volumes") or []:
        ref = volume.get("configMap") or {}
        if ref.get("name") == BASE_CONFIGMAP:
            ref["name"] = configmap_name(name)


def _label_model(isvc: dict[str, Any], model: str | None, revision: str | None) -> None:
    """Set the predictor's storageUri and one revision label on predictor, transformer and annotation.

    The label is --revision, else one derived from the storageUri: another model is always another
    cache key (re-creating a tenant on another model or profile never serves the old model's cached
    answers), and the stable transformer of a first canary is keyed by a revision (without one it
    would cache the canary's answers as its own).
    """
    predictor = isvc["spec"]["predictor"]["model"]
    if model:
        predictor["storageUri"] = model
    anns = isvc["metadata"].setdefault("annotations", {})
    label = revision or default_revision(predictor.get("storageUri", ""))
    anns[REVISION_ANN] = checked_revision(label)
    set_env(predictor, PREDICTOR_REVISION_ENV, label)
    containers = (isvc["spec"].get("transformer") or {}).get("containers") or []
    if containers:
        set_env(containers[0], REVISION_ENV, label)  # the first container is semserve's transformer


def default_revision(model: str) -> str:
    """A revision label for a storageUri: stable (same URI, same label) and short."""
    return "r" + hashlib.sha256(model.encode()).hexdigest()[:10]


def checked_revision(label: str) -> str:
    # It is an annotation value, an env value and part of every cache key: keep it plain.
    if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}", label):
        raise TenantError(f"--revision {label!r}: letters, digits, '-', '_' and '.', at most 63 characters")
    return label


def env_value(container: dict[str, Any], name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name:
            return str(e.get("value", ""))
    return None


def set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


def set_predictor_host(container: dict[str, Any], host: str) -> None:
    args = container.setdefault("args", [])
    flag = next(
        (a.split("=", 1)[0] + "=" for a in args if a.startswith(PREDICTOR_HOST_FLAGS)),
        PREDICTOR_HOST_FLAGS[0],
    )
    container["args"] = [a for a in args if not a.startswith(PREDICTOR_HOST_FLAGS)] + [flag + host]


# --- YAML output ------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line strings (the dashboard JSON, PromQL) as readable block scalars.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_objects(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False)


def required_secrets(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Secrets the objects read but do not create (name -> keys read; empty: the whole Secret),
    found where Kubernetes reads them: env `secretKeyRef`, `secret` volumes and projected sources,
    `imagePullSecrets`. Optional references are left out: a pod starts without them."""
    created = {d["metadata"]["name"] for d in docs if d.get("kind") == "Secret"}
    found: dict[str, set[str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("secretKeyRef")
            if isinstance(ref, dict) and ref.get("name") and not ref.get("optional"):
                found.setdefault(ref["name"], set()).add(str(ref.get("key", "")))
            vol = node.get("secret")
            if isinstance(vol, dict) and not vol.get("optional"):
                name = vol.get("secretName") or vol.get("name")
                if name:
                    keys = found.setdefault(name, set())
                    keys.update(str(i["key"]) for i in vol.get("items") or [] if "key" in i)
            for pull in node.get("imagePullSecrets") or []:
                if isinstance(pull, dict) and pull.get("name"):
                    found.setdefault(pull["name"], set())
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for doc in docs:
        walk(doc)
    return {name: {k for k in keys if k} for name, keys in sorted(found.items()) if name not in created}


def secrets_note(docs: list[dict[str, Any]], namespace: str) -> str:
    """YAML comment lines naming the Secrets to create first (a comment keeps the output
    appliable with `kubectl apply -f -`)."""
    needed = required_secrets(docs)
    if not needed:
        return ""
    lines = [f"# Secrets that must exist in namespace {namespace} before these objects are applied:"]
    for name, keys in needed.items():
        lines.append(f"#   {name}" + (f" (keys: {', '.join(sorted(keys))})" if keys else ""))
    lines.append("# (manifests/README.md says how to create them.)")
    return "\n".join(lines) + "\n"
