"""`semserve tenant status`: readiness, URL, model revision, and desired/actual replicas per component,
read from the InferenceService and what KServe and Knative made of it (PodAutoscalers, Revisions, or
the Deployments of Standard mode)."""

from __future__ import annotations

from typing import Any

from serverless.kube_client import Client
from serverless.tenant_objects import (
    CACHE_EPOCH_ANN,
    COMPONENTS,
    ISVC_API,
    KNATIVE_API,
    PA_API,
    PROFILE_LABEL,
    REVISION_ANN,
    ROLLOUT_ANN,
)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def deployment_mode(isvc: dict[str, Any]) -> str:
    anns = (isvc.get("metadata") or {}).get("annotations") or {}
    return (
        "Standard"
        if anns.get("serving.kserve.io/deploymentMode") in ("Standard", "RawDeployment")
        else "Knative"
    )


def component_status(cl: Client, isvc: dict[str, Any], component: str) -> dict[str, Any]:
    ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
    comp_status = ((isvc.get("status") or {}).get("components") or {}).get(component) or {}
    conds = conditions(isvc)
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
    if deployment_mode(isvc) == "Knative":
        rev = comp_status.get("latestCreatedRevision") or comp_status.get("latestReadyRevision")
        pa = cl.get_or_none(PA_API, "PodAutoscaler", ns, rev) if rev else None
        if pa is not None:
            st = pa.get("status") or {}
            out["desired"], out["actual"] = st.get("desiredScale"), st.get("actualScale")
            active = conditions(pa).get("Active") or {}
            out["pa_active"] = active.get("status", "Unknown")
    else:
        dep = cl.get_or_none("apps/v1", "Deployment", ns, f"{name}-{component}")
        if dep is not None:
            out["desired"] = (dep.get("spec") or {}).get("replicas")
            out["actual"] = (dep.get("status") or {}).get("readyReplicas", 0)
    out["scaled_to_zero"] = out["actual"] == 0 and (out["desired"] in (0, None))
    out["canary_percent"] = spec.get("canaryTrafficPercent")
    out["traffic"] = revision_traffic(cl, ns, comp_status) if deployment_mode(isvc) == "Knative" else []
    return out


def revision_traffic(cl: Client, namespace: str, comp_status: dict[str, Any]) -> list[dict[str, Any]]:
    """Each revision that receives traffic (KServe's status.components.<c>.traffic), with the
    Knative Revision's own readiness: during a canary, both the canary and the previous one."""
    out = []
    targets = comp_status.get("traffic") or []
    for t in targets:
        name = t.get("revisionName") or ""
        rev = cl.get_or_none(KNATIVE_API, "Revision", namespace, name) if name else None
        ready = (conditions(rev).get("Ready") or {}).get("status", "Unknown") if rev else "Unknown"
        # Split traffic: the latest revision is the canary, the other the previous rollout.
        role = "stable" if len(targets) == 1 else "canary" if t.get("latestRevision") else "previous"
        out.append(
            {
                "revision": name,
                "percent": int(t.get("percent") or 0),
                "tag": t.get("tag") or "",
                "latest": bool(t.get("latestRevision")),
                "ready": ready,
                "role": role,
            }
        )
    return out


def tenant_status(cl: Client, namespace: str, name: str) -> dict[str, Any]:
    isvc = cl.get(ISVC_API, "InferenceService", namespace, name)
    conds = conditions(isvc)
    ready = conds.get("Ready") or {}
    anns = (isvc.get("metadata") or {}).get("annotations") or {}
    return {
        "name": name,
        "namespace": namespace,
        "model_revision": anns.get(REVISION_ANN, ""),
        "rollout": anns.get(ROLLOUT_ANN, ""),
        "cache_epoch": anns.get(CACHE_EPOCH_ANN, ""),
        "profile": ((isvc.get("metadata") or {}).get("labels") or {}).get(PROFILE_LABEL, ""),
        "mode": deployment_mode(isvc),
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
            [
                f"model revision {st.get('model_revision') or '-'}  rollout {st.get('rollout') or '-'}  "
                f"cache epoch {st.get('cache_epoch') or '0'}"
            ]
            if st.get("model_revision") or st.get("rollout")
            else []
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
