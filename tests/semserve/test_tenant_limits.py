"""semserve/tenant_limits.py: the one strict parser of per-tenant limits (the transformer's
--tenant-limits-file, `semserve tenant` flags). Every refusal names the tenant and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semserve.tenant_limits import LimitsError, LimitsTable, TenantLimits


def test_a_tenant_gets_its_own_entry_else_the_default_else_no_limits() -> None:
    table = LimitsTable.parse({
        "acme": {"requests_per_minute": 60, "tokens_per_minute": 10000, "max_concurrent": 4, "weight": 2},
        "default": {"requests_per_minute": 10},
    })
    assert table.of("acme") == TenantLimits(60, 10000, 4, 2.0)
    assert table.of("someone") == TenantLimits(requests_per_minute=10)
    assert LimitsTable.parse({"acme": {}}).of("other") == TenantLimits()
    assert not TenantLimits(weight=3).limited and TenantLimits(max_concurrent=0).limited
    assert table.as_json()["default"] == {"requests_per_minute": 10}


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"requests_per_minute": "60"}, ["'acme'", "'requests_per_minute'", "integer"]),
        ({"tokens_per_minute": -1}, ["'acme'", "'tokens_per_minute'", "negative"]),
        ({"max_concurrent": 1.5}, ["'acme'", "'max_concurrent'", "integer"]),
        ({"max_concurrent": True}, ["'acme'", "'max_concurrent'", "integer"]),
        ({"weight": 0}, ["'acme'", "'weight'", "above 0"]),
        ({"weight": "x"}, ["'acme'", "'weight'", "number"]),
        ({"rpm": 5}, ["'acme'", "unknown field 'rpm'"]),
        ([1], ["'acme'", "expected an object"]),
    ],
)
def test_a_bad_entry_is_refused_naming_tenant_and_field(entry: object, words: list[str]) -> None:
    with pytest.raises(LimitsError) as err:
        LimitsTable.parse({"acme": entry})
    for word in words:
        assert word in str(err.value)


def test_a_bad_file_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text("{\"acme\": {\"max_concurrent\": -2}}")
    with pytest.raises(LimitsError, match=r"limits.json: tenant 'acme': field 'max_concurrent'"):
        LimitsTable.load(path)
    path.write_text("{\"acme\": ")
    with pytest.raises(LimitsError, match="invalid JSON at line 1"):
        LimitsTable.load(path)
    path.write_text(json.dumps(["acme"]))
    with pytest.raises(LimitsError, match="expected a JSON object"):
        LimitsTable.load(path)
    with pytest.raises(LimitsError, match=r"missing\.json"):
        LimitsTable.load(tmp_path / "missing.json")
