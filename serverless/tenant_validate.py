"""Offline validation of rendered manifests, as strict as the API server plus the rules KServe's
webhook and Knative enforce beyond the schemas.

Three layers, each problem reported as one line naming the object and the field:

1. CRD kinds (InferenceService, ServingRuntime, PodMonitor, ServiceMonitor, PrometheusRule) against
   the upstream CRD schemas in `manifests/schemas`, made strict: every object schema that lists
   `properties` (and does not say `x-kubernetes-preserve-unknown-fields`) is closed, so a typo such
   as `minReplica` fails as the API server's strict field validation would, not silently pass.
2. Core kinds (Service, StatefulSet, NetworkPolicy, ...) with `kubernetes-validate` (strict).
3. `webhook_rules`: KServe's InferenceService validation (replica bounds, metric/class pairs,
   deploymentStrategy only in Standard mode, names) and Knative's (one port, h2c or http1 names,
   annotation ranges, revision timeout), as listed in shared/reference/kserve.md. The Knative
   autoscaling bounds are those `serverless.settings_from_manifest` resolves, so what validates
   here is what `semserve simulate` can simulate.
4. semserve's own rules, which no webhook enforces: the sleep setting (serverless/tenant_sleep.py)
   and the tenant limits (serverless/tenant_limits_config.py: the transformer's own parser on a
   limits ConfigMap, and a limits file mounted so that updates reach the pods).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from serverless import settings_from_manifest as sfm
from serverless.tenant_limits_config import limits_rules
from serverless.tenant_sleep import sleep_rules

ROOT = Path(__file__).resolve().parent.parent
K8S_VERSION = os.environ.get("SEMSERVE_K8S_VERSION", "1.32.0")
KN = "autoscaling.knative.dev/"
NAME_RE = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DEPLOYMENT_MODES = ("Knative", "Serverless", "Standard", "RawDeployment", "ModelMesh")
KNATIVE_MODES = ("Knative", "Serverless")
AUTOSCALER_CLASSES = ("hpa", "external", "keda", "none")
# Knative's config-defaults max-revision-timeout-seconds and container-concurrency-max-limit.
MAX_REVISION_TIMEOUT_S = 600
MAX_CONTAINER_CONCURRENCY = 1000
KNATIVE_PORT_NAMES = ("", "http1", "h2c")
COMPONENTS = ("predictor", "transformer", "explainer")


def schemas_dir(root: Path = ROOT) -> Path | None:
    """$SEMSERVE_SCHEMAS_DIR, else the copies in the repository (`manifests/schemas`, with their
    sources and licence in its README); None when neither exists."""
    candidates = [os.environ.get("SEMSERVE_SCHEMAS_DIR"), root / "manifests" / "schemas"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def schemas_missing(root: Path = ROOT) -> str:
    """What to say when schemas_dir() finds nothing."""
    env = os.environ.get("SEMSERVE_SCHEMAS_DIR")
    where = f"$SEMSERVE_SCHEMAS_DIR={env}" if env else str(root / "manifests" / "schemas")
    return (
        f"CRD schemas not found at {where}: the manifests and the fake API server are validated "
        "against them (the repository carries them in manifests/schemas/, see its README)"
    )


def strict(schema: Any) -> Any:
    """A copy where every object schema with `properties` and no preserve-unknown-fields is closed."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in schema
    ):
        out["additionalProperties"] = False
    return out


def _object_ref(doc: dict[str, Any]) -> str:
    name = (doc.get("metadata") or {}).get("name", "<unnamed>")
    return f"{doc.get('kind', '<no kind>')}/{name}"


def _field(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


@functools.lru_cache(maxsize=4)
def load_crd_schemas(directory: str) -> dict[tuple[str, str], dict[str, Any]]:
    """{(apiVersion, kind): strict schema} from every CRD file under `directory`."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the ISVC CRD is 1.9 MB
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(Path(directory).rglob("*.yaml")):
        for crd in yaml.load_all(path.read_text(), Loader=loader):
            if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema:
                    out[(f"{group}/{version['name']}", kind)] = strict(schema)
    return out


def _schema_errors(doc: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    ref = _object_ref(doc)
    validator = jsonschema.Draft7Validator(schema)
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        where = _field(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = set((err.schema or {}).get("properties") or {})
            for key in sorted(set(err.instance) - known):
                yield f"{ref}: {_field([*err.absolute_path, key])}: unknown field"
            continue
        yield f"{ref}: {where}: {err.message}"


def _core_errors(doc: dict[str, Any], version: str) -> Iterator[str]:
    import kubernetes_validate  # optional: core kinds are skipped with a message without it

    ref = _object_ref(doc)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = _field(e.path)
        msg = e.message
        if m := re.match(r"Additional properties are not allowed \((.+) (?:was|were) unexpected\)", msg):
            for key in re.findall(r"'([^']+)'", m.group(1)):
                yield f"{ref}: {_field([*e.path, key])}: unknown field"
            return
        yield f"{ref}: {where}: {msg}"
    except kubernetes_validate.SchemaNotFoundError:
        yield f"{ref}: apiVersion {doc.get('apiVersion')!r} kind {doc.get('kind')!r}: no schema known"


def _metadata_errors(doc: dict[str, Any]) -> Iterator[str]:
    # CRD schemas leave metadata open (the API server checks ObjectMeta itself).
    ref = _object_ref(doc)
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        yield f"{ref}: metadata.name: required"
        return
    name = str(meta["name"])
    if len(name) > 253 or not DNS1123_RE.fullmatch(name):
        yield f"{ref}: metadata.name: {name!r} is not a DNS-1123 name"
    for part in ("labels", "annotations"):
        for k, v in (meta.get(part) or {}).items():
            if not isinstance(v, str):
                yield f"{ref}: metadata.{part}.{k}: must be a string, got {v!r} (quote it in YAML)"


def validate_objects(
    docs: list[dict[str, Any]],
    schemas: dict[tuple[str, str], dict[str, Any]] | None,
    *,
    k8s_version: str = K8S_VERSION,
    cluster_config: dict[str, str] | None = None,
) -> list[str]:
    """Every problem in `docs`, one line each; [] when all are valid. With `schemas` None, CRD kinds
    get only the webhook rules."""
    errors: list[str] = []
    for doc in docs:
        errors.extend(_metadata_errors(doc))
        key = (str(doc.get("apiVersion")), str(doc.get("kind")))
        group = key[0].rpartition("/")[0]
        if not ("." not in group or group.endswith(".k8s.io")):
            # A custom resource: its CRD schema, or a clear line that there is none (never a pass).
            if schemas is not None and key in schemas:
                errors.extend(_schema_errors(doc, schemas[key]))
            elif schemas is not None:
                errors.append(f"{_object_ref(doc)}: apiVersion {key[0]!r}: no CRD schema for it")
        else:
            errors.extend(_core_errors(doc, k8s_version))
        errors.extend(webhook_rules(doc, cluster_config))
        # semserve's own rule (no admission webhook enforces it): the sleep annotation and the
        # predictor's env agree, and no sleep on a CPU predictor (the pod would refuse to start).
        errors.extend(sleep_rules(doc))
        # And the tenant limits: a limits ConfigMap the transformer would refuse, or a limits file
        # mounted so that updates never reach the pods (serverless/tenant_limits_config.py).
        errors.extend(limits_rules(doc))
    return errors


# --- KServe webhook and Knative rules -----------------------------------------------------------


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(spec.get("model"), dict):
        out.append(("model", spec["model"]))
    for i, c in enumerate(spec.get("containers") or []):
        out.append((f"containers[{i}]", c))
    return out


def webhook_rules(doc: dict[str, Any], cluster_config: dict[str, str] | None = None) -> list[str]:
    if doc.get("kind") != "InferenceService":
        return []
    ref = _object_ref(doc)
    meta = doc.get("metadata") or {}
    errors: list[str] = []
    name = str(meta.get("name", ""))
    if not NAME_RE.fullmatch(name):
        errors.append(f"{ref}: metadata.name: {name!r} must match [a-z]([-a-z0-9]*[a-z0-9])?")
    anns = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    mode = anns.get("serving.kserve.io/deploymentMode", "Knative")
    if mode not in DEPLOYMENT_MODES:
        errors.append(
            f"{ref}: metadata.annotations.serving.kserve.io/deploymentMode: {mode!r} is not one of "
            f"{list(DEPLOYMENT_MODES)}"
        )
        return errors
    knative = mode in KNATIVE_MODES
    as_class = anns.get("serving.kserve.io/autoscalerClass")
    if as_class is not None and as_class not in AUTOSCALER_CLASSES:
        errors.append(
            f"{ref}: metadata.annotations.serving.kserve.io/autoscalerClass: {as_class!r} is not one of "
            f"{list(AUTOSCALER_CLASSES)}"
        )
    if knative and as_class is not None:
        errors.append(
            f"{ref}: metadata.annotations.serving.kserve.io/autoscalerClass: {as_class!r} applies to "
            "Standard mode only; Knative mode scales with the KPA"
        )
    spec = doc.get("spec") or {}
    for comp in COMPONENTS:
        cspec = spec.get(comp)
        if not isinstance(cspec, dict):
            continue
        at = f"{ref}: spec.{comp}"
        before = len(errors)
        lo, hi = cspec.get("minReplicas"), cspec.get("maxReplicas")
        if isinstance(lo, int) and lo < 0:
            errors.append(f"{at}.minReplicas: {lo} must be >= 0")
        if isinstance(hi, int) and hi < 0:
            errors.append(f"{at}.maxReplicas: {hi} must be >= 0")
        # KServe: minReplicas defaults to 1; maxReplicas 0 means no upper bound.
        lo_eff = lo if isinstance(lo, int) else 1
        if isinstance(hi, int) and hi > 0 and lo_eff > hi:
            errors.append(f"{at}.minReplicas: {lo_eff} is greater than maxReplicas {hi}")
        cc = cspec.get("containerConcurrency")
        if isinstance(cc, int) and cc < 0:
            errors.append(f"{at}.containerConcurrency: {cc} must be >= 0")
        metric = cspec.get("scaleMetric")
        comp_anns = {str(k): str(v) for k, v in (cspec.get("annotations") or {}).items()}
        for k in (f"{KN}min-scale", f"{KN}max-scale", f"{KN}minScale", f"{KN}maxScale"):
            if k in comp_anns or k in anns:
                errors.append(
                    f"{at}.annotations.{k}: KServe drops this annotation; use spec.{comp}."
                    f"{'minReplicas' if 'min' in k else 'maxReplicas'}"
                )
        if knative:
            if isinstance(cc, int) and cc > MAX_CONTAINER_CONCURRENCY:
                errors.append(
                    f"{at}.containerConcurrency: {cc} exceeds Knative's {MAX_CONTAINER_CONCURRENCY}"
                )
            if metric is not None and metric not in ("concurrency", "rps"):
                errors.append(
                    f"{at}.scaleMetric: {metric!r} is not supported by the Knative KPA (concurrency or rps)"
                )
            if cspec.get("deploymentStrategy") is not None:
                errors.append(f"{at}.deploymentStrategy: only allowed in Standard mode, not Knative")
            if cspec.get("autoScaling") is not None:
                errors.append(f"{at}.autoScaling: HPA/KEDA metrics apply to Standard mode only")
            timeout = cspec.get("timeout")
            if isinstance(timeout, int) and not 0 < timeout <= MAX_REVISION_TIMEOUT_S:
                errors.append(f"{at}.timeout: {timeout} is outside (0, {MAX_REVISION_TIMEOUT_S}] seconds")
            if cspec.get("terminationGracePeriodSeconds") is not None:
                errors.append(f"{at}.terminationGracePeriodSeconds: Knative sets it from spec.{comp}.timeout")
            for where, c in _containers(cspec):
                ports = c.get("ports") or []
                if len(ports) > 1:
                    errors.append(
                        f"{at}.{where}.ports: Knative allows one port per container, got {len(ports)}"
                    )
                for i, p in enumerate(ports):
                    pname = str(p.get("name", ""))
                    if pname not in KNATIVE_PORT_NAMES:
                        errors.append(
                            f"{at}.{where}.ports[{i}].name: {pname!r} must be h2c (gRPC) or http1 "
                            "in Knative mode"
                        )
            # Knative's annotation bounds, resolved exactly as the simulator resolves them.
            if comp in ("predictor", "transformer") and len(errors) == before:
                try:
                    sfm.settings_from_inferenceservice(doc, comp, cluster_config)
                except ValueError as e:
                    errors.append(f"{at}: {e}")
        else:
            knative_anns = sorted(k for k in {**anns, **comp_anns} if k.startswith(KN))
            if knative_anns:
                errors.append(f"{at}.annotations: {knative_anns} need Knative mode; {mode} ignores them")
            klass = as_class or "hpa"
            if metric is not None:
                if klass == "hpa" and metric not in ("cpu", "memory"):
                    errors.append(f"{at}.scaleMetric: {metric!r} is not supported by HPA (cpu or memory)")
                elif metric in ("concurrency", "rps") and klass != "external":
                    errors.append(f"{at}.scaleMetric: {metric!r} needs Knative mode")
            if klass == "hpa":
                for i, m in enumerate((cspec.get("autoScaling") or {}).get("metrics") or []):
                    if m.get("type") != "Resource":
                        errors.append(
                            f"{at}.autoScaling.metrics[{i}].type: {m.get('type')!r} needs "
                            "serving.kserve.io/autoscalerClass: keda (HPA takes Resource metrics only)"
                        )
            if klass == "keda":
                for i, m in enumerate((cspec.get("autoScaling") or {}).get("metrics") or []):
                    ext = m.get("external") if m.get("type") == "External" else None
                    if m.get("type") == "External" and not ((ext or {}).get("metric") or {}).get("query"):
                        errors.append(f"{at}.autoScaling.metrics[{i}].external.metric.query: required")
            if lo == 0 and klass == "hpa":
                errors.append(f"{at}.minReplicas: 0 needs Knative or KEDA; an HPA cannot scale to zero")
    return errors
