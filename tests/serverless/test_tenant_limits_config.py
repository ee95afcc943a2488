"""Tenant limits in the manifests (serverless/tenant_limits_config.py): `semserve tenant create`'s limit
flags land in the tenant's own NAME-tenant-limits ConfigMap, which the transformer mounts as a
directory and reads as its --tenant-limits-file; `semserve tenant update` server-side applies that
ConfigMap and nothing else, against a FAKE API server (real HTTP, real kubernetes client, CRD
schemas). A bad value, given as a flag or hand-edited into the ConfigMap, is refused with the
transformer's own message naming the tenant and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from semserve.tenant_limits import LimitsError, LimitsTable, TenantLimits, parse_entry
from serverless import tenant_limits_config as lc
from serverless import tenant_objects as objects
from serverless import tenant_validate as tv
from tests.serverless.fake_apiserver import FakeApiServer
from tests.serverless.test_tenant import ISVC, cli, run

# test_tenant's fixtures (kubectl check, schemas, the fake API server and its kubeconfig), reused.
from tests.serverless.test_tenant import _needs_kubectl as _needs_kubectl
from tests.serverless.test_tenant import fake as fake
from tests.serverless.test_tenant import kubeconfig as kubeconfig
from tests.serverless.test_tenant import schemas_dir as schemas_dir

CM = ("v1", "configmaps")


def _docs(out: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(out) if d]


def _limits_cm(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in docs if lc.is_limits_configmap(d)]
    return cm


def _table(cm: dict[str, Any]) -> LimitsTable:
    # The transformer's own loader, on the file as the pod would see it.
    return LimitsTable.parse(json.loads(cm["data"][lc.LIMITS_KEY]))


def _transformer(isvc: dict[str, Any]) -> dict[str, Any]:
    return isvc["spec"]["transformer"]["containers"][0]


def test_create_renders_the_limits_into_the_tenants_configmap(
    capsys: pytest.CaptureFixture[str], schemas_dir: Path
) -> None:
    assert run(["create", "quiet", "-n", "x", "--profile", "dev-cpu", "--requests-per-minute", "60",
                "--tokens-per-minute", "20000", "--max-concurrent", "4", "--weight", "2",
                "--dry-run"]) == 0  # fmt: skip
    docs = _docs(capsys.readouterr().out)
    cm = _limits_cm(docs)
    assert cm["metadata"]["name"] == "quiet-tenant-limits" and cm["metadata"]["namespace"] == "x"
    assert cm["metadata"]["labels"][objects.TENANT_LABEL] == "quiet"
    # The flags set the "default" entry: the deployment's one tenant when auth is off, and every
    # API-key tenant without an entry of its own.
    assert _table(cm).of("anyone") == TenantLimits(60, 20000, 4, 2.0)
    (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
    container = _transformer(isvc)
    env = {e["name"]: e.get("value") for e in container["env"]}
    path = env[lc.LIMITS_ENV]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "tenant-limits"]
    # A directory mount (a subPath mount never sees an update), of this tenant's ConfigMap.
    assert path == f"{mount['mountPath']}/{lc.LIMITS_KEY}" and "subPath" not in mount
    (volume,) = [v for v in isvc["spec"]["transformer"]["volumes"] if v["name"] == "tenant-limits"]
    assert volume["configMap"]["name"] == "quiet-tenant-limits"
    assert tv.validate_objects(docs, tv.load_crd_schemas(str(schemas_dir))) == []


def test_without_flags_the_table_is_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["create", "bob", "-n", "x", "--profile", "standard", "--dry-run"]) == 0
    cm = _limits_cm(_docs(capsys.readouterr().out))
    assert json.loads(cm["data"][lc.LIMITS_KEY]) == {}
    assert _table(cm).of("bob") == TenantLimits()


@pytest.mark.parametrize(
    ("flag", "value", "tenant", "raw"),
    [
        ("--requests-per-minute", "-5", "default", -5),
        ("--tokens-per-minute", "1.5", "default", 1.5),
        ("--max-concurrent", "many", "default", "many"),
        ("--weight", "0", "noisy", 0),
        ("--weight", "abc", "noisy", "abc"),
    ],
)
def test_a_bad_flag_gets_the_transformers_message(
    flag: str, value: str, tenant: str, raw: object, capsys: pytest.CaptureFixture[str]
) -> None:
    field = flag.removeprefix("--").replace("-", "_")
    with pytest.raises(LimitsError) as expected:
        parse_entry(tenant, {field: raw})
    assert f"tenant {tenant!r}" in str(expected.value) and f"'{field}'" in str(expected.value)
    argv = ["create", "t", "-n", "x", "--profile", "dev", f"{flag}={value}", "--dry-run"]
    if tenant != "default":
        argv += ["--limits-tenant", tenant]
    assert run(argv) == 1
    out = capsys.readouterr()
    assert out.err.strip() == f"semserve tenant create: {expected.value}" and out.out == ""


def test_update_changes_only_the_limits(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "shared", "-n", "team", "--profile", "dev",
               "--requests-per-minute", "100") == 0  # fmt: skip
    before = copy.deepcopy(fake.objects)
    sent = len(fake.requests)
    # Two API-key tenants on one InferenceService: a noisy one with half the quiet one's share.
    assert cli(kubeconfig, "update", "shared", "-n", "team", "--limits-tenant", "quiet",
               "--weight", "2") == 0  # fmt: skip
    assert cli(kubeconfig, "update", "shared", "-n", "team", "--limits-tenant", "noisy",
               "--tokens-per-minute", "5000", "--max-concurrent", "8") == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "ConfigMap/shared-tenant-limits applied" in out
    assert "noisy: tokens_per_minute=5000, max_concurrent=8" in out
    assert "quiet: weight=2\n" in out
    cm = fake.get(*CM, "team", "shared-tenant-limits")
    assert cm is not None
    table = _table(cm)
    assert table.of("quiet") == TenantLimits(weight=2.0)
    assert table.of("noisy") == TenantLimits(None, 5000, 8)
    assert table.of("someone-else") == TenantLimits(requests_per_minute=100)
    # Nothing else was written: every other object is as `create` left it, labels of this one too.
    key = ("v1", "configmaps", "team", "shared-tenant-limits")
    assert {k: v for k, v in fake.objects.items() if k != key} == {
        k: v for k, v in before.items() if k != key
    }
    assert cm["metadata"]["labels"] == before[key]["metadata"]["labels"]
    writes = [(m, p, q) for m, p, q in fake.requests[sent:] if m != "GET"]
    assert writes and all(p.endswith("/configmaps/shared-tenant-limits") for _, p, _ in writes)
    assert all(q["fieldManager"] == ["semserve-tenant"] for _, _, q in writes)
    # A limit lifted, an entry removed; re-applying the same is no conflict.
    assert cli(kubeconfig, "update", "shared", "-n", "team", "--limits-tenant", "noisy",
               "--max-concurrent", "none") == 0  # fmt: skip
    assert _table(fake.get(*CM, "team", "shared-tenant-limits")).of("noisy") == TenantLimits(None, 5000)
    assert cli(kubeconfig, "update", "shared", "-n", "team", "--limits-tenant", "quiet", "--remove") == 0
    assert cli(kubeconfig, "update", "shared", "-n", "team", "--limits-tenant", "quiet", "--remove") == 0
    table = _table(fake.get(*CM, "team", "shared-tenant-limits"))
    assert set(table.entries) == {"default", "noisy"}
    assert fake.get(*ISVC, "team", "shared") == before[(*ISVC, "team", "shared")]


def test_creating_again_keeps_the_limits(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "t2", "-n", "ns", "--profile", "dev", "--requests-per-minute", "10") == 0
    assert cli(kubeconfig, "update", "t2", "-n", "ns", "--limits-tenant", "quiet", "--weight", "2") == 0
    capsys.readouterr()
    # Another profile, no limit flags: the table stays as `update` left it.
    assert cli(kubeconfig, "create", "t2", "-n", "ns", "--profile", "prod") == 0
    assert "limits kept from the tenant's ConfigMap" in capsys.readouterr().out
    table = _table(fake.get(*CM, "ns", "t2-tenant-limits"))
    assert table.of("quiet") == TenantLimits(weight=2.0)
    assert table.of("other") == TenantLimits(requests_per_minute=10)
    assert fake.get(*CM, "ns", "t2-tenant-limits")["metadata"]["labels"][objects.PROFILE_LABEL] == "prod"
    # With flags, they change their entry and keep the others.
    assert cli(kubeconfig, "create", "t2", "-n", "ns", "--profile", "prod", "--max-concurrent", "3") == 0
    table = _table(fake.get(*CM, "ns", "t2-tenant-limits"))
    assert table.of("other") == TenantLimits(requests_per_minute=10, max_concurrent=3)
    assert table.of("quiet") == TenantLimits(weight=2.0)


def test_update_refuses_bad_values_and_missing_tenants(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "t1", "-n", "ns", "--profile", "dev") == 0
    capsys.readouterr()
    stored = copy.deepcopy(fake.get(*CM, "ns", "t1-tenant-limits"))
    assert cli(kubeconfig, "update", "t1", "-n", "ns", "--limits-tenant", "noisy",
               "--requests-per-minute", "ten") == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err == (
        "semserve tenant update: tenant 'noisy': field 'requests_per_minute' must be an integer, got 'ten'"
    )
    assert cli(kubeconfig, "update", "t1", "-n", "ns") == 1
    assert "--requests-per-minute" in capsys.readouterr().err
    assert cli(kubeconfig, "update", "t1", "-n", "ns", "--remove", "--weight", "2") == 1
    capsys.readouterr()
    assert cli(kubeconfig, "update", "nobody", "-n", "ns", "--weight", "2") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("semserve tenant update: tenant ns/nobody has no ConfigMap nobody-tenant-limits")
    assert fake.get(*CM, "ns", "t1-tenant-limits") == stored
    # A server-side dry run passes admission and writes nothing.
    assert cli(kubeconfig, "update", "t1", "-n", "ns", "--weight", "3", "--server-dry-run") == 0
    assert "ConfigMap/t1-tenant-limits passes server-side dry run" in capsys.readouterr().out
    assert fake.get(*CM, "ns", "t1-tenant-limits") == stored
    # A bad entry someone wrote by hand is named; --remove of that entry repairs the file.
    hand = copy.deepcopy(stored)
    hand["data"][lc.LIMITS_KEY] = json.dumps({"default": {"weight": 1}, "noisy": {"max_concurent": 3}})
    fake.put(hand)
    assert cli(kubeconfig, "update", "t1", "-n", "ns", "--limits-tenant", "quiet", "--weight", "2") == 1
    err = capsys.readouterr().err
    assert "tenant 'noisy': unknown field 'max_concurent'" in err
    assert cli(kubeconfig, "update", "t1", "-n", "ns", "--limits-tenant", "noisy", "--remove") == 0
    assert set(_table(fake.get(*CM, "ns", "t1-tenant-limits")).entries) == {"default"}


def test_delete_takes_the_tenants_limits_and_keeps_the_shared_objects(
    fake: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(kubeconfig, "create", "gone", "-n", "ns", "--profile", "dev", "--weight", "3") == 0
    assert cli(kubeconfig, "delete", "gone", "-n", "ns") == 0
    assert "ConfigMap/gone-tenant-limits deleted" in capsys.readouterr().out
    assert fake.get(*CM, "ns", "gone-tenant-limits") is None
    assert fake.get(*CM, "ns", "semserve-grafana-dashboard") is not None


# --- The strict manifest checks catch hand edits --------------------------------------------------


def _rendered(profile: str = "dev") -> list[dict[str, Any]]:
    return objects.tenant_objects(profile, "alice", "ns")


@pytest.mark.parametrize(
    ("limits_json", "says"),
    [
        ('{"noisy": {"weight": -1}}', "tenant 'noisy': field 'weight' must be above 0, got -1"),
        ('{"noisy": {"requests_per_minute": "60"}}',
         "tenant 'noisy': field 'requests_per_minute' must be an integer, got '60'"),
        ('{"default": {"tokens_per_minute": -10}}',
         "tenant 'default': field 'tokens_per_minute' must not be negative, got -10"),
        ('{"quiet": {"burst": 5}}', "tenant 'quiet': unknown field 'burst'"),
        ('{"quiet": 5}', "tenant 'quiet': expected an object of limits, got int"),
        ('["quiet"]', "expected a JSON object {tenant: limits}, got list"),
        ('{"quiet": {"weight": 2},}', "invalid JSON at line 1 column 25"),
    ],
)  # fmt: skip
def test_validation_names_tenant_and_field_of_a_hand_edited_configmap(
    limits_json: str, says: str, schemas_dir: Path
) -> None:
    docs = _rendered()
    cm = _limits_cm(docs)
    cm["data"][lc.LIMITS_KEY] = limits_json
    errors = tv.validate_objects(docs, tv.load_crd_schemas(str(schemas_dir)))
    assert len(errors) == 1, errors
    assert errors[0].startswith("ConfigMap/alice-tenant-limits: data.limits.json: ") and says in errors[0]


def test_validation_catches_a_limits_file_that_never_updates() -> None:
    (isvc,) = [d for d in _rendered() if d["kind"] == "InferenceService"]
    assert tv.validate_objects([isvc], None) == []
    container = _transformer(isvc)
    sub = copy.deepcopy(isvc)
    (mount,) = [m for m in _transformer(sub)["volumeMounts"] if m["name"] == "tenant-limits"]
    mount.update(mountPath="/etc/semserve/limits/limits.json", subPath="limits.json")
    (error,) = tv.validate_objects([sub], None)
    assert "InferenceService/alice" in error and lc.LIMITS_ENV in error and "subPath" in error
    unmounted = copy.deepcopy(isvc)
    _transformer(unmounted)["volumeMounts"] = [
        m for m in container["volumeMounts"] if m["name"] != "tenant-limits"
    ]
    (error,) = tv.validate_objects([unmounted], None)
    assert "no volumeMount holds it" in error
    listed = copy.deepcopy(isvc)
    (volume,) = [v for v in listed["spec"]["transformer"]["volumes"] if v["name"] == "tenant-limits"]
    volume["configMap"]["items"] = [{"key": "limits.json", "path": "other.json"}]
    (error,) = tv.validate_objects([listed], None)
    assert "lists items without 'limits.json'" in error


def test_every_profile_mounts_its_own_limits() -> None:
    for profile in objects.PROFILES:
        docs = _rendered(profile)
        (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
        refs = {v["configMap"]["name"] for v in isvc["spec"]["transformer"]["volumes"] if "configMap" in v}
        assert refs == {_limits_cm(docs)["metadata"]["name"]} == {"alice-tenant-limits"}, profile
        assert all(lc.limits_rules(d) == [] for d in docs), profile
