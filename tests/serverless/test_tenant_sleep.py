"""The sleep tier on a tenant (serverless/tenant_sleep.py): `semserve tenant create --sleep-after-idle-s`
annotates the InferenceService and sets the predictor's env, the objects pass the strict manifest
checks and a FAKE API server (real HTTP, real kubernetes client, CRD schemas), and a CPU profile is
refused with the predictor's own message. Malformed or disagreeing settings fail validation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from semserve import sleep_mode
from serverless import tenant_objects as objects
from serverless import tenant_sleep as ts
from serverless import tenant_validate as tv
from tests.serverless.fake_apiserver import FakeApiServer
from tests.serverless.test_tenant import ISVC, cli, run

# test_tenant's fixtures (kubectl check, schemas, the fake API server and its kubeconfig), reused.
from tests.serverless.test_tenant import _needs_kubectl as _needs_kubectl
from tests.serverless.test_tenant import fake as fake
from tests.serverless.test_tenant import kubeconfig as kubeconfig
from tests.serverless.test_tenant import schemas_dir as schemas_dir


def _isvc(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "InferenceService")


def _predictor_env(isvc: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in isvc["spec"]["predictor"]["model"].get("env", [])}


def test_dry_run_renders_annotation_and_env(capsys: pytest.CaptureFixture[str], schemas_dir: Path) -> None:
    assert run(["create", "gpu-dev", "-n", "x", "--profile", "dev", "--sleep-after-idle-s", "300",
                "--dry-run"]) == 0  # fmt: skip
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    isvc = _isvc(docs)
    assert isvc["metadata"]["annotations"][ts.SLEEP_ANN] == "300"
    assert _predictor_env(isvc)[ts.SLEEP_ENV] == "300"
    assert tv.validate_objects(docs, tv.load_crd_schemas(str(schemas_dir))) == []


def test_cpu_profile_is_refused_with_the_predictors_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "cpu-dev", "--profile", "dev-cpu", "--sleep-after-idle-s", "300", "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"semserve tenant create: {sleep_mode.CPU_REFUSAL}"
    # 0 is "off", which a CPU tenant may say.
    assert run(["create", "cpu-dev", "--profile", "dev-cpu", "--sleep-after-idle-s", "0", "--dry-run"]) == 0
    assert ts.SLEEP_ANN not in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["-1", "soon", "nan"])
def test_bad_seconds(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "gpu-dev", "--profile", "dev", f"--sleep-after-idle-s={bad}", "--dry-run"]) == 1
    assert "--sleep-after-idle-s" in capsys.readouterr().err


def test_applied_through_the_api_server(fake: FakeApiServer, kubeconfig: Path) -> None:
    assert cli(kubeconfig, "create", "alice", "-n", "team-a", "--profile", "dev",
               "--sleep-after-idle-s", "120") == 0  # fmt: skip
    isvc = fake.get(*ISVC, "team-a", "alice")
    assert isvc is not None and isvc["metadata"]["annotations"][ts.SLEEP_ANN] == "120"
    assert _predictor_env(isvc)[ts.SLEEP_ENV] == "120"


def test_validation_catches_hand_edits() -> None:
    gpu = _isvc(objects.tenant_objects("dev", "t", "ns"))
    cpu = _isvc(objects.tenant_objects("dev-cpu", "t", "ns"))
    assert ts.predictor_has_gpu(gpu) and not ts.predictor_has_gpu(cpu)
    ts.set_sleep(gpu, 300)
    assert ts.sleep_rules(gpu) == []
    disagree = copy.deepcopy(gpu)
    disagree["metadata"]["annotations"][ts.SLEEP_ANN] = "60"
    assert "disagree" in " ".join(ts.sleep_rules(disagree))
    malformed = copy.deepcopy(gpu)
    malformed["metadata"]["annotations"][ts.SLEEP_ANN] = "5m"
    assert "not a number of seconds" in " ".join(ts.sleep_rules(malformed))
    # Hand-annotated CPU tenant: refused by the same validation the overlays pass.
    cpu["metadata"]["annotations"][ts.SLEEP_ANN] = "300"
    cpu["spec"]["predictor"]["model"].setdefault("env", []).append({"name": ts.SLEEP_ENV, "value": "300"})
    assert any(sleep_mode.CPU_REFUSAL in e for e in tv.validate_objects([cpu], None))
    # Setting 0 removes both again.
    ts.set_sleep(gpu, 0)
    assert ts.SLEEP_ANN not in gpu["metadata"]["annotations"] and ts.SLEEP_ENV not in _predictor_env(gpu)


def test_overlays_carry_no_sleep_on_cpu() -> None:
    for profile in objects.PROFILES:
        isvc = _isvc(objects.tenant_objects(profile, "t", "ns"))
        assert ts.sleep_rules(isvc) == [], profile
