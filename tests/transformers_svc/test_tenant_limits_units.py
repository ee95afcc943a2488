"""The parts of per-tenant limits that need no server: OpenAI's reset format, the learned prompt
token estimate, and the limits file's reload as a Kubernetes ConfigMap volume updates it (a
symlink swapped to a new directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from semserve.tenant_limits import LimitsError, TenantLimits
from transformers_svc.admission import TokenEstimate, go_duration
from transformers_svc.tenant_quota import TenantQuotas


def test_reset_durations_are_written_as_openai_writes_them() -> None:
    assert go_duration(0.02) == "20ms"
    assert go_duration(0) == "0ms"
    assert go_duration(1) == "1s"
    assert go_duration(1.5) == "1.5s"
    assert go_duration(360) == "6m0s"
    assert go_duration(61.25) == "1m1.25s"
    assert go_duration(3600) == "1h0m0s"


def test_the_prompt_estimate_learns_from_reported_usage() -> None:
    estimate = TokenEstimate()
    tokens, how = estimate.tokens(100)
    assert how.startswith("default") and tokens == 30
    estimate.learn(100, 25)
    tokens, how = estimate.tokens(400)
    assert how.startswith("learned") and tokens == 100
    for _ in range(200):  # the ratio follows what the predictor reports
        estimate.learn(100, 50)
    assert estimate.tokens(100)[0] in (50, 51)


def _configmap(root: Path, version: str, text: str) -> None:
    """Write `text` the way the kubelet does: a new timestamped directory, `..data` swapped to it."""
    new = root / f"..{version}"
    new.mkdir()
    (new / "limits.json").write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(new.name)
    os.replace(tmp, root / "..data")
    link = root / "limits.json"
    if not link.is_symlink():
        link.symlink_to("..data/limits.json")


def test_a_configmap_update_reaches_the_table_and_a_bad_one_keeps_the_old(tmp_path: Path) -> None:
    _configmap(tmp_path, "1", '{"acme": {"requests_per_minute": 5}}')
    quotas = TenantQuotas(tmp_path / "limits.json")
    assert quotas.of("acme") == TenantLimits(requests_per_minute=5)
    assert not quotas.reload()  # nothing changed
    _configmap(tmp_path, "2", '{"acme": {"requests_per_minute": 7}, "default": {"max_concurrent": 1}}')
    assert quotas.reload()
    assert quotas.of("acme").requests_per_minute == 7 and quotas.of("x").max_concurrent == 1
    _configmap(tmp_path, "3", '{"acme": {"requests_per_minute": "7"}}')
    assert not quotas.reload()  # logged, and the limits in force are kept
    assert quotas.of("acme").requests_per_minute == 7
    # A bad file at start is refused (the transformer stops) naming tenant and field.
    _configmap(tmp_path, "4", '{"beta": {"weight": -1}}')
    with pytest.raises(LimitsError, match="tenant 'beta': field 'weight'"):
        TenantQuotas(tmp_path / "limits.json")
