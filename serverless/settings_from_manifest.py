"""Autoscaling settings from a rendered InferenceService, as KServe and Knative would resolve them.

KServe maps component fields onto Knative annotations (`SetAutoScalingAnnotations`): `minReplicas` ->
min-scale (1 when absent), `maxReplicas` -> max-scale (omitted when 0), `scaleTarget` -> target,
`scaleMetric` -> metric; `containerConcurrency` and `timeout` go onto the Revision. Knative then fills
what is still absent from `config-autoscaler` (`pkg/autoscaler/config/config.go` defaults), and resolves
the decider's target as `ResolveMetricTarget` does. Bounds are those of Knative's annotation validation;
a bad value raises ValueError naming the field.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import yaml

from serverless.metrics import panic_window_seconds
from serverless.sim_settings import KSERVE_DEFAULT_MIN_REPLICAS, REVISION_TIMEOUT_DEFAULT_S, SimSettings

KN = "autoscaling.knative.dev/"
KPA_CLASS = "kpa.autoscaling.knative.dev"
TARGET_MIN = 0.01
WINDOW_MIN_S, WINDOW_MAX_S = 6.0, 3600.0

# config-autoscaler defaults (Knative `defaultConfig()`), by configmap key.
CLUSTER_DEFAULTS: dict[str, str] = {
    "enable-scale-to-zero": "true",
    "allow-zero-initial-scale": "false",
    "container-concurrency-target-percentage": "70",
    "container-concurrency-target-default": "100",
    "requests-per-second-target-default": "200",
    "target-burst-capacity": "211",
    "panic-window-percentage": "10",
    "panic-threshold-percentage": "200",
    "max-scale-up-rate": "1000",
    "max-scale-down-rate": "2",
    "activator-capacity": "100",
    "stable-window": "60s",
    "scale-to-zero-grace-period": "30s",
    "scale-to-zero-pod-retention-period": "0s",
    "scale-down-delay": "0s",
    "initial-scale": "1",
    "min-scale": "0",
    "max-scale": "0",
}

# Knative still accepts the older camelCase keys (kmap.KeyPriority); the kebab-case one wins.
_LEGACY_KEYS = {
    "min-scale": "minScale",
    "max-scale": "maxScale",
    "initial-scale": "initialScale",
    "scale-down-delay": "scaleDownDelay",
    "target-utilization-percentage": "targetUtilizationPercentage",
    "target-burst-capacity": "targetBurstCapacity",
    "panic-window-percentage": "panicWindowPercentage",
    "panic-threshold-percentage": "panicThresholdPercentage",
    "activation-scale": "activationScale",
    "scale-to-zero-pod-retention-period": "scaleToZeroPodRetentionPeriod",
}

_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | int | float, name: str) -> float:
    """A Go duration ("90s", "1m30s", "500ms") in seconds; a bare number is taken as seconds."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"{name}: {value!r} is not a duration (e.g. 60s, 1m30s)")
    return total


def _float(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not a number") from None


def _int(value: Any, name: str) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not an integer") from None
    if f != int(f):
        raise ValueError(f"{name}: {value!r} is not an integer")
    return int(f)


def _bool(value: Any, name: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name}: {value!r} is not a boolean")


def _component_annotations(isvc: dict[str, Any], component: str) -> tuple[dict[str, str], dict[str, Any]]:
    meta = isvc.get("metadata") or {}
    spec = (isvc.get("spec") or {}).get(component)
    if spec is None:
        raise ValueError(f"spec.{component}: the InferenceService has no {component}")
    anns: dict[str, str] = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    # Component annotations go onto the revision after the ISVC's, so they win.
    anns.update({str(k): str(v) for k, v in (spec.get("annotations") or {}).items()})
    return anns, spec


def _get(anns: dict[str, str], key: str) -> tuple[str, str] | None:
    if KN + key in anns:
        return KN + key, anns[KN + key]
    legacy = _LEGACY_KEYS.get(key)
    if legacy and KN + legacy in anns:
        return KN + legacy, anns[KN + legacy]
    return None


def _gpus(spec: dict[str, Any]) -> float:
    containers = [spec.get("model") or {}, *(spec.get("containers") or [])]
    for c in containers:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            gpu = (res.get(part) or {}).get("nvidia.com/gpu")
            if gpu is not None:
                return _float(gpu, f"resources.{part}.nvidia.com/gpu")
    return 1.0  # a pod holds one accelerator unless the manifest says otherwise


@dataclass
class _Lookup:
    """Where each value comes from: the revision's annotations, else config-autoscaler, else Knative's
    default. Records in `sources` where each value it hands out was found."""

    anns: dict[str, str]
    cluster_config: dict[str, str] | None
    sources: dict[str, str]

    def cluster(self, key: str) -> str:
        config = self.cluster_config or {}
        self.sources[key] = "config-autoscaler" if key in config else "knative default"
        return config[key] if key in config else CLUSTER_DEFAULTS[key]

    def ann(self, key: str) -> tuple[str, str] | None:
        """(annotation name, value) for a Knative key, legacy spelling included."""
        hit = _get(self.anns, key)
        if hit:
            self.sources[key] = hit[0]
        return hit

    def ann_or_cluster(self, key: str, cluster_key: str | None = None) -> str:
        hit = self.ann(key)
        return hit[1] if hit else self.cluster(cluster_key or key)


def settings_from_inferenceservice(
    isvc: dict[str, Any],
    component: str = "predictor",
    cluster_config: dict[str, str] | None = None,
) -> SimSettings:
    """Resolve one component's autoscaling as KServe + Knative would deploy it."""
    if isvc.get("kind", "InferenceService") != "InferenceService":
        raise ValueError(f"kind: expected InferenceService, got {isvc.get('kind')!r}")
    anns, spec = _component_annotations(isvc, component)
    config = {k: str(v) for k, v in cluster_config.items()} if cluster_config else None
    s = SimSettings(name=str((isvc.get("metadata") or {}).get("name", "isvc")), component=component)
    look = _Lookup(anns, config, s.sources)
    # The order below is the order `sources` lists (and `--show-settings` prints) them in.
    _check_kpa(anns)
    _metric(s, spec, anns, component)
    _replicas(s, spec, anns, component)
    _target(s, spec, look, component)
    _windows(s, look)
    _scale_timing(s, look)
    return s


def _check_kpa(anns: dict[str, str]) -> None:
    mode = anns.get("serving.kserve.io/deploymentMode", "Knative")
    if mode not in ("Knative", "Serverless"):
        raise ValueError(
            f"serving.kserve.io/deploymentMode: {mode!r} is not Knative; only KPA-scaled (Knative mode) "
            "InferenceServices can be simulated"
        )
    as_class = anns.get("serving.kserve.io/autoscalerClass")
    if as_class not in (None, "", "kpa.autoscaling.knative.dev"):
        raise ValueError(f"serving.kserve.io/autoscalerClass: {as_class!r} is not simulated (KPA only)")
    kn_class = anns.get(KN + "class", KPA_CLASS)
    if kn_class != KPA_CLASS:
        raise ValueError(f"{KN}class: {kn_class!r} is not simulated (only {KPA_CLASS})")


def _metric(s: SimSettings, spec: dict[str, Any], anns: dict[str, str], component: str) -> None:
    # Metric: scaleMetric field wins over the annotation, as KServe overwrites it.
    metric = spec.get("scaleMetric") or anns.get(KN + "metric") or "concurrency"
    if metric not in ("concurrency", "rps"):
        raise ValueError(f"{component}.scaleMetric: {metric!r}; the KPA scales on concurrency or rps")
    s.metric = metric
    algo = anns.get(KN + "metric-aggregation-algorithm", "linear")
    if algo not in ("linear", "weighted-exponential", "weightedExponential"):
        raise ValueError(f"{KN}metric-aggregation-algorithm: {algo!r} is not linear or weighted-exponential")
    s.aggregation_algorithm = algo


def _replicas(s: SimSettings, spec: dict[str, Any], anns: dict[str, str], component: str) -> None:
    """Min/max replicas, containerConcurrency, timeout, progress deadline and GPUs: the component's fields."""
    src = s.sources
    # min/max-scale: KServe's serviceAnnotationDisallowedList drops the annotations; the fields decide.
    for key in ("min-scale", "max-scale"):
        if _get(anns, key):
            s.warnings.append(f"{KN}{key} is dropped by KServe; use minReplicas/maxReplicas")
    min_r = spec.get("minReplicas")
    s.min_scale = KSERVE_DEFAULT_MIN_REPLICAS if min_r is None else _int(min_r, f"{component}.minReplicas")
    src["min_scale"] = "kserve default" if min_r is None else f"{component}.minReplicas"
    max_r = spec.get("maxReplicas")
    s.max_scale = 0 if max_r is None else _int(max_r, f"{component}.maxReplicas")
    src["max_scale"] = "unlimited" if max_r is None else f"{component}.maxReplicas"
    if s.min_scale < 0:
        raise ValueError(f"{component}.minReplicas: {s.min_scale} must be >= 0")
    if s.max_scale < 0:
        raise ValueError(f"{component}.maxReplicas: {s.max_scale} must be >= 0 (0 = unlimited)")
    if s.max_scale and s.min_scale > s.max_scale:
        raise ValueError(f"{component}.minReplicas: {s.min_scale} is greater than maxReplicas {s.max_scale}")

    cc = spec.get("containerConcurrency")
    s.container_concurrency = 0 if cc is None else _int(cc, f"{component}.containerConcurrency")
    if s.container_concurrency < 0:
        raise ValueError(f"{component}.containerConcurrency: {s.container_concurrency} must be >= 0")
    timeout = spec.get("timeout")
    s.timeout_s = REVISION_TIMEOUT_DEFAULT_S if timeout is None else _float(timeout, f"{component}.timeout")
    if s.timeout_s <= 0:
        raise ValueError(f"{component}.timeout: {s.timeout_s} must be positive")
    pd = anns.get("serving.knative.dev/progress-deadline")
    if pd is not None:
        s.progress_deadline_s = parse_duration(pd, "serving.knative.dev/progress-deadline")
    s.gpus_per_pod = _gpus(spec)


def _target(s: SimSettings, spec: dict[str, Any], look: _Lookup, component: str) -> None:
    """The decider's per-pod target, as Knative's ResolveMetricTarget resolves it."""
    if s.metric == "rps":
        key = "requests-per-second-target-default"
        total = _float(look.cluster(key), key)
    else:
        key = "container-concurrency-target-default"
        total = float(s.container_concurrency) or _float(look.cluster(key), key)
    key = "container-concurrency-target-percentage"
    tu = _float(look.cluster(key), key)
    if tu > 1.0:
        tu /= 100.0  # the configmap takes 70 or 0.7
    scale_target = spec.get("scaleTarget")
    target_hit = (
        (f"{component}.scaleTarget", str(scale_target)) if scale_target is not None else look.ann("target")
    )
    if target_hit:
        t = _float(target_hit[1], target_hit[0])
        if t < TARGET_MIN:
            raise ValueError(f"{target_hit[0]}: {t} should be at least {TARGET_MIN}")
        if s.metric == "rps" and t < 1:
            raise ValueError(f"{target_hit[0]}: an rps target must be >= 1, got {t}")
        # Never aim above what containerConcurrency lets a pod take.
        cc = s.container_concurrency
        total = min(t, cc) if s.metric == "concurrency" and cc else t
        s.sources["target"] = target_hit[0]
    if hit := look.ann("target-utilization-percentage"):
        pct = _float(hit[1], hit[0])
        if not 1 <= pct <= 100:
            raise ValueError(f"{hit[0]}: {pct} is outside [1, 100]")
        tu = pct / 100.0
    s.target, s.total_value, s.target_utilization = total, total, tu
    s.target_value = max(TARGET_MIN, total * tu)


def _windows(s: SimSettings, look: _Lookup) -> None:
    """Stable and panic windows, panic threshold, burst capacity and the scale rates."""
    window_raw = look.ann_or_cluster("window", "stable-window")
    s.stable_window = parse_duration(window_raw, f"{KN}window")
    if not WINDOW_MIN_S <= s.stable_window <= WINDOW_MAX_S:
        raise ValueError(f"{KN}window: {window_raw} is outside [6s, 1h]")
    if s.stable_window != round(s.stable_window):
        raise ValueError(f"{KN}window: {window_raw} must have at most second precision")
    pwp_raw = look.ann_or_cluster("panic-window-percentage")
    s.panic_window_percentage = _float(pwp_raw, f"{KN}panic-window-percentage")
    if not 1.0 <= s.panic_window_percentage <= 100.0:
        raise ValueError(f"{KN}panic-window-percentage: {pwp_raw} is outside [1, 100]")
    s.panic_window = panic_window_seconds(s.stable_window, s.panic_window_percentage)
    ptp_raw = look.ann_or_cluster("panic-threshold-percentage")
    s.panic_threshold_percentage = _float(ptp_raw, f"{KN}panic-threshold-percentage")
    if not 110.0 <= s.panic_threshold_percentage <= 1000.0:
        raise ValueError(f"{KN}panic-threshold-percentage: {ptp_raw} is outside [110, 1000]")

    tbc_raw = look.ann_or_cluster("target-burst-capacity")
    s.target_burst_capacity = _float(tbc_raw, f"{KN}target-burst-capacity")
    if s.target_burst_capacity < 0 and s.target_burst_capacity != -1:
        raise ValueError(f"{KN}target-burst-capacity: {tbc_raw} must be >= 0 or -1 (unlimited)")

    # Rates exist only cluster-wide in Knative; the annotations are accepted here for what-if runs.
    for key, attr in (
        ("max-scale-up-rate", "max_scale_up_rate"),
        ("max-scale-down-rate", "max_scale_down_rate"),
    ):
        raw = look.ann_or_cluster(key)
        value = _float(raw, key)
        if value <= 1.0:
            raise ValueError(f"{KN}{key}: {raw} must be greater than 1")
        setattr(s, attr, value)


def _scale_timing(s: SimSettings, look: _Lookup) -> None:
    """Initial and activation scale, scale-down delay, retention, grace period, activator capacity."""
    allow_zero = _bool(look.cluster("allow-zero-initial-scale"), "allow-zero-initial-scale")
    s.initial_scale = _int(look.cluster("initial-scale"), "initial-scale")
    if hit := look.ann("initial-scale"):
        init = _int(hit[1], hit[0])
        if init < 0:
            raise ValueError(f"{hit[0]}: {init} must be >= 0")
        if init == 0 and not allow_zero:
            s.warnings.append(f"{hit[0]}=0 ignored: config-autoscaler allow-zero-initial-scale is false")
            s.sources["initial-scale"] = "knative default (0 not allowed)"
        else:
            s.initial_scale = init

    if hit := look.ann("activation-scale"):
        act = _int(hit[1], hit[0])
        if act < 2:
            raise ValueError(f"{hit[0]}: activation-scale={act} must be greater than 1")
        if s.min_scale > act:
            raise ValueError(f"{hit[0]}: min-scale={s.min_scale} is greater than activation-scale={act}")
        if s.max_scale and s.max_scale < act:
            raise ValueError(f"{hit[0]}: max-scale={s.max_scale} is less than activation-scale={act}")
        s.activation_scale = act

    sdd_raw = look.ann_or_cluster("scale-down-delay")
    s.scale_down_delay = parse_duration(sdd_raw, f"{KN}scale-down-delay")
    if not 0 <= s.scale_down_delay <= WINDOW_MAX_S:
        raise ValueError(f"{KN}scale-down-delay: {sdd_raw} is outside [0s, 1h]")
    if s.scale_down_delay != round(s.scale_down_delay):
        raise ValueError(f"{KN}scale-down-delay: {sdd_raw} must have at most second precision")
    ret_raw = look.ann_or_cluster("scale-to-zero-pod-retention-period")
    s.scale_to_zero_pod_retention_period = parse_duration(ret_raw, f"{KN}scale-to-zero-pod-retention-period")
    if not 0 <= s.scale_to_zero_pod_retention_period <= WINDOW_MAX_S:
        raise ValueError(f"{KN}scale-to-zero-pod-retention-period: {ret_raw} is outside [0s, 1h]")
    s.scale_to_zero_grace_period = parse_duration(
        look.cluster("scale-to-zero-grace-period"), "scale-to-zero-grace-period"
    )
    if s.scale_to_zero_grace_period <= 0:
        raise ValueError("scale-to-zero-grace-period: must be positive")
    s.enable_scale_to_zero = _bool(look.cluster("enable-scale-to-zero"), "enable-scale-to-zero")
    s.activator_capacity = _float(look.cluster("activator-capacity"), "activator-capacity")
    if s.activator_capacity < 1:
        raise ValueError("activator-capacity: must be at least 1")


# --- Manifests on disk ------------------------------------------------------------------------


def pick_inferenceservice(docs: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    isvcs = [d for d in docs if d.get("kind") == "InferenceService"]
    if name is not None:
        isvcs = [d for d in isvcs if (d.get("metadata") or {}).get("name") == name]
    if not isvcs:
        raise ValueError("no InferenceService found" + (f" named {name!r}" if name else ""))
    if len(isvcs) > 1:
        names = [(d.get("metadata") or {}).get("name") for d in isvcs]
        raise ValueError(f"several InferenceServices {names}; choose one with --name")
    return isvcs[0]


def cluster_config_from(docs: list[dict[str, Any]]) -> dict[str, str] | None:
    """A `config-autoscaler` ConfigMap shipped with the overlay overrides Knative's defaults."""
    for d in docs:
        if d.get("kind") == "ConfigMap" and (d.get("metadata") or {}).get("name") == "config-autoscaler":
            return {str(k): str(v) for k, v in (d.get("data") or {}).items() if not str(k).startswith("_")}
    return None


def apply_overrides(isvc: dict[str, Any], component: str, overrides: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE`: a component field (`minReplicas=0`) or an annotation
    (`autoscaling.knative.dev/window=120s`)."""
    isvc = copy.deepcopy(isvc)
    spec = isvc.setdefault("spec", {}).setdefault(component, {})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        if "/" in key:
            spec.setdefault("annotations", {})[key] = value
        else:
            spec[key] = yaml.safe_load(value)
    return isvc
