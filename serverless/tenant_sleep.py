"""The sleep tier on a tenant: the annotation `semserve.io/sleep-after-idle-s` on the InferenceService,
rendered into the predictor's env (SEMSERVE_PREDICTOR_SLEEP_AFTER_IDLE_S, a PredictorSettings field),
and the rule that keeps the two in step and off CPU predictors.

vLLM's CPU backend has no sleep mode: a predictor without a GPU in its resources gets the same
refusal the predictor itself gives at start (semserve/sleep_mode.py), here before anything is applied.
"""

from __future__ import annotations

import math
from typing import Any

from semserve import sleep_mode

SLEEP_ANN = "semserve.io/sleep-after-idle-s"
SLEEP_ENV = "SEMSERVE_PREDICTOR_SLEEP_AFTER_IDLE_S"
# Extended resources that give a pod an accelerator vLLM can sleep on (CUDA, ROCm, XPU).
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe")


class SleepSettingError(ValueError):
    """One line for the user."""


def _predictor_container(isvc: dict[str, Any]) -> dict[str, Any] | None:
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    if isinstance(predictor.get("model"), dict):
        return predictor["model"]
    containers = predictor.get("containers") or []
    return containers[0] if containers else None


def predictor_has_gpu(isvc: dict[str, Any]) -> bool:
    container = _predictor_container(isvc) or {}
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        for name in GPU_RESOURCES:
            value = (resources.get(part) or {}).get(name)
            if value is not None and str(value) not in ("0", ""):
                return True
    return False


def parse_seconds(raw: Any, where: str) -> float:
    try:
        seconds = float(str(raw))
    except ValueError:
        raise SleepSettingError(f"{where}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SleepSettingError(f"{where}: {raw!r} must be a number of seconds >= 0 (0: never sleeps)")
    return seconds


def _env(container: dict[str, Any]) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == SLEEP_ENV:
            return str(e.get("value", ""))
    return None


def set_sleep(isvc: dict[str, Any], seconds: float | str) -> None:
    """Annotate the tenant and set the predictor's env; 0 removes both. Refused on a CPU predictor."""
    value = parse_seconds(seconds, "--sleep-after-idle-s")
    if value > 0 and not predictor_has_gpu(isvc):
        raise SleepSettingError(sleep_mode.CPU_REFUSAL)
    container = _predictor_container(isvc)
    if container is None:
        raise SleepSettingError("the InferenceService has no predictor container to configure")
    anns = isvc.setdefault("metadata", {}).setdefault("annotations", {})
    env = [e for e in container.get("env") or [] if e.get("name") != SLEEP_ENV]
    if value > 0:
        anns[SLEEP_ANN] = f"{value:g}"
        env.append({"name": SLEEP_ENV, "value": f"{value:g}"})
    else:
        anns.pop(SLEEP_ANN, None)
    container["env"] = env


def sleep_rules(doc: dict[str, Any]) -> list[str]:
    """Problems with an InferenceService's sleep setting: a malformed annotation, an env that says
    otherwise, or sleep on a predictor without a GPU."""
    if doc.get("kind") != "InferenceService":
        return []
    meta = doc.get("metadata") or {}
    ref = f"InferenceService/{meta.get('name', '?')}"
    raw_ann = (meta.get("annotations") or {}).get(SLEEP_ANN)
    container = _predictor_container(doc) or {}
    raw_env = _env(container)
    if raw_ann is None and raw_env is None:
        return []
    errors = []
    try:
        ann = parse_seconds(raw_ann, f"metadata.annotations.{SLEEP_ANN}") if raw_ann is not None else 0.0
        env = parse_seconds(raw_env, f"predictor env {SLEEP_ENV}") if raw_env is not None else 0.0
    except SleepSettingError as e:
        return [f"{ref}: {e}"]
    if ann != env:
        errors.append(
            f"{ref}: annotation {SLEEP_ANN}={raw_ann!r} and predictor env {SLEEP_ENV}={raw_env!r} "
            "disagree (`semserve tenant create --sleep-after-idle-s` sets both)"
        )
    if max(ann, env) > 0 and not predictor_has_gpu(doc):
        errors.append(f"{ref}: {sleep_mode.CPU_REFUSAL}")
    return errors
