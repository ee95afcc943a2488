"""The alerts and recording rules of manifests/base/alerts.yaml under Debian's promtool: they parse,
and each alert fires on input series that should fire it and stays quiet on series that should not
(each case has a namespace "hot", which fires, and "cold", which does not)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.prometheus import alerts, binary, write_rules


def _hist(name: str, ns: str, buckets: dict[str, str]) -> list[dict[str, str]]:
    return [
        {"series": f'{name}_bucket{{namespace="{ns}",model_name="llm",le="{le}"}}', "values": v}
        for le, v in buckets.items()
    ]


def _lookups(ns: str, result: str, values: str) -> dict[str, str]:
    return {
        "series": f'semserve_cache_lookups_total{{namespace="{ns}",model_name="llm",result="{result}"}}',
        "values": values,
    }


_REDIS_ERRORS = 'semserve_cache_redis_errors_total{{namespace="{ns}",model_name="llm"}}'
_REFUSED = (
    'semserve_tenant_refused_total{{namespace="{ns}",model_name="llm",tenant="{tenant}",reason="{reason}"}}'
)
# hot as Prometheus 2.x stores vLLM's gauge (OpenMetrics scrape: `vllm_`), cold as vLLM names it.
_WAITING = '{name}{{namespace="{ns}",model_name="llm",pod="p"}}'

# alert -> (interval, eval time, input series, labels of the alert that fires in "hot").
CASES: dict[str, tuple[str, str, list[dict[str, str]], dict[str, str]]] = {
    "SemserveCacheErrorRate": (
        "1m", "25m",
        [
            # hot: half the lookups fail; cold: none do. Redis errors counted apart stay 0.
            _lookups("hot", "error", "0+60x30"), _lookups("hot", "miss", "0+60x30"),
            _lookups("cold", "error", "0+0x30"), _lookups("cold", "miss", "0+60x30"),
            {"series": _REDIS_ERRORS.format(ns="hot"), "values": "0+0x30"},
            {"series": _REDIS_ERRORS.format(ns="cold"), "values": "0+0x30"},
        ],
        {"namespace": "hot", "model_name": "llm", "severity": "warning"},
    ),
    "SemserveCacheHitRatioCollapse": (
        # 2-minute samples (rate over 5m needs two), a day of a steady 83 % hit ratio, then 3 hours:
        # hot drops to 8 %, cold stays.
        "2m", "27h",
        [
            _lookups("hot", "exact", "0+40x720 28804+4x90"),
            _lookups("hot", "miss", "0+8x720 5804+44x90"),
            _lookups("cold", "exact", "0+40x810"),
            _lookups("cold", "miss", "0+8x810"),
        ],
        {"namespace": "hot", "model_name": "llm", "severity": "warning"},
    ),
    "SemserveLatencyP99High": (
        "1m", "20m",
        # hot: every request between 30 and 60 s; cold: every one under 1 s.
        _hist("semserve_transformer_request_duration_seconds", "hot",
              {"1": "0+0x30", "30": "0+0x30", "60": "0+10x30", "+Inf": "0+10x30"})
        + _hist("semserve_transformer_request_duration_seconds", "cold",
                {"1": "0+10x30", "30": "0+10x30", "60": "0+10x30", "+Inf": "0+10x30"}),
        {"namespace": "hot", "model_name": "llm", "severity": "warning"},
    ),
    "SemservePredictorTTFTP99High": (
        "1m", "20m",
        _hist("semserve_predictor_time_to_first_token_seconds", "hot",
              {"1": "0+0x30", "10": "0+0x30", "30": "0+10x30", "+Inf": "0+10x30"})
        + _hist("semserve_predictor_time_to_first_token_seconds", "cold",
                {"1": "0+10x30", "10": "0+10x30", "30": "0+10x30", "+Inf": "0+10x30"}),
        {"namespace": "hot", "model_name": "llm", "severity": "warning"},
    ),
    "SemservePredictorColdStarts": (
        # hot: a new predictor process every 5 minutes (12 an hour); cold: one process all along.
        "5m", "1h",
        [
            {"series": 'process_start_time_seconds{job="semserve-predictor",namespace="hot",'
                       'serving_kserve_io_inferenceservice="t",pod="p"}', "values": "0+300x20"},
            {"series": 'process_start_time_seconds{job="semserve-predictor",namespace="cold",'
                       'serving_kserve_io_inferenceservice="t",pod="p"}', "values": "100x20"},
        ],
        {"namespace": "hot", "serving_kserve_io_inferenceservice": "t", "severity": "info"},
    ),
    "SemservePredictorQueueing": (
        "1m", "15m",
        [
            {"series": _WAITING.format(name="vllm_num_requests_waiting", ns="hot"), "values": "12x20"},
            {"series": _WAITING.format(name="vllm:num_requests_waiting", ns="cold"), "values": "3x20"},
        ],
        {"namespace": "hot", "severity": "warning"},
    ),
    "SemserveTenantsShedSaturated": (
        "1m", "20m",
        [
            # hot: 10 misses a minute shed as saturated. cold: a noisy tenant over its fair share
            # (its own business, not the operator's) and one saturated shed in 20 minutes.
            {"series": _REFUSED.format(ns="hot", tenant="noisy", reason="saturated"), "values": "0+10x30"},
            {"series": _REFUSED.format(ns="hot", tenant="quiet", reason="saturated"), "values": "0+1x30"},
            {"series": _REFUSED.format(ns="cold", tenant="noisy", reason="fair_share"), "values": "0+30x30"},
            {"series": _REFUSED.format(ns="cold", tenant="quiet", reason="saturated"), "values": "0x10 1x20"},
        ],
        {"namespace": "hot", "model_name": "llm", "severity": "warning"},
    ),
}  # fmt: skip


def _annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, text in rule.get("annotations", {}).items():
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        out[key] = text
    return out


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    rules = write_rules(tmp_path / "rules.yaml")
    out = subprocess.run([binary("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(1 for _ in alerts()) + 2} rules found" in out.stdout, out.stdout


def test_every_alert_has_a_case() -> None:
    assert set(CASES) == set(alerts()), "add input series for the new alert to CASES"


def test_alerts_fire_on_hot_and_not_on_cold(tmp_path: Path) -> None:
    write_rules(tmp_path / "rules.yaml")
    rules = alerts()
    tests = []
    for name, (interval, eval_time, series, labels) in CASES.items():
        tests.append({
            "name": name,
            "interval": interval,
            "input_series": series,
            # Exactly one alert, the hot namespace's: promtool fails on a missing or an extra one.
            "alert_rule_test": [{
                "eval_time": eval_time,
                "alertname": name,
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": _annotations(rules[name], labels)}],
            }],
        })  # fmt: skip
    test_file = tmp_path / "alerts_test.yaml"
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    test_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = subprocess.run(
        [binary("promtool"), "test", "rules", str(test_file)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
