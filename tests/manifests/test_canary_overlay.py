"""overlays/canary: the static form of `semserve tenant rollout`. Its JSON6902 patches address the
base's env and args by index; this checks they still land on the right entries."""

from __future__ import annotations

from typing import Any

from serverless import tenant_objects as objects
from tests.manifests.conftest import by_kind


def test_canary_overlay_patches_the_right_fields(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (isvc,) = by_kind(rendered["overlays/canary"], "InferenceService")
    (prod,) = by_kind(rendered["overlays/prod"], "InferenceService")
    spec, anns = isvc["spec"], isvc["metadata"]["annotations"]
    assert spec["predictor"]["canaryTrafficPercent"] == 10 == spec["transformer"]["canaryTrafficPercent"]
    assert spec["predictor"]["model"]["storageUri"] != prod["spec"]["predictor"]["model"]["storageUri"]
    assert anns[objects.TAG_ROUTING_ANN] == "true" and anns[objects.ROLLOUT_ANN] == "canary"
    predictor_env = {e["name"]: e.get("value") for e in spec["predictor"]["model"]["env"]}
    assert predictor_env[objects.PREDICTOR_REVISION_ENV] == "v2"  # the canary labels its answers
    prod_predictor_env = {e["name"]: e.get("value") for e in prod["spec"]["predictor"]["model"]["env"]}
    # prod's revision is labelled too (v1), so its stable transformer does not cache the canary's answers.
    prod_env0 = {e["name"]: e.get("value") for e in prod["spec"]["transformer"]["containers"][0]["env"]}
    assert prod_predictor_env[objects.PREDICTOR_REVISION_ENV] == prod_env0[objects.REVISION_ENV] == "v1"
    assert prod["metadata"]["annotations"][objects.REVISION_ANN] == "v1"
    assert {k: v for k, v in predictor_env.items() if k != objects.PREDICTOR_REVISION_ENV} == {
        k: v for k, v in prod_predictor_env.items() if k != objects.PREDICTOR_REVISION_ENV
    }
    container = spec["transformer"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[objects.REVISION_ENV] == anns[objects.REVISION_ANN] == "v2"
    hosts = [a for a in container["args"] if a.startswith("--predictor_host=")]
    assert hosts == ["--predictor_host=" + objects.CANARY_PREDICTOR_HOST]
    # Everything else is prod's.
    prod_env = {e["name"]: e.get("value") for e in prod["spec"]["transformer"]["containers"][0]["env"]}
    assert {k: v for k, v in env.items() if k != objects.REVISION_ENV} == {
        k: v for k, v in prod_env.items() if k != objects.REVISION_ENV
    }
