"""Expected conditions are one log line at info/warning, not an error with a traceback: the
readiness probes answered 503 while the engine loads (the suite's probe asks twice a second), and
a client's request for a model this server does not serve."""

from __future__ import annotations

import json

import httpx

from tests.conftest import Predictor


def _this_run(predictor: Predictor) -> list[dict]:
    """The log lines of the predictor process now running (its log file is appended to across
    runs and restarts): everything from its last `predictor_settings` line on."""
    lines = []
    for raw in predictor.process.log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # vLLM's worker processes print some plain lines
        if entry.get("event") == "predictor_settings":
            lines = []
        lines.append(entry)
    return lines


def test_engine_load_probes_are_quiet_info_lines(predictor: Predictor) -> None:
    lines = _this_run(predictor)
    assert lines and lines[0].get("event") == "predictor_settings"
    not_ready = [e for e in lines if e.get("event") == "request_not_ready"]
    # The suite polled readiness while the engine loaded: those 503s are there, as info, no traceback.
    assert not_ready, "no readiness probe was answered 503 during engine load?"
    assert all(e["level"] == "info" and "exc" not in e and e["status"] == 503 for e in not_ready)
    errors = [e for e in lines if e["level"] == "error" and e.get("logger", "").startswith("kserve")]
    assert not errors, errors[:2]


def test_unknown_model_is_one_warning_line(predictor: Predictor) -> None:
    before = len(_this_run(predictor))
    r = httpx.post(
        f"{predictor.http}/v2/models/no-such-model/infer",
        json={"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]},
        headers={"x-request-id": "quiet-logs-404"},
        timeout=30,
    )
    assert r.status_code == 404
    new = _this_run(predictor)[before:]
    mine = [e for e in new if e.get("request_id") == "quiet-logs-404"]
    rejected = [e for e in mine if e.get("event") == "request_rejected"]
    assert len(rejected) == 1, mine
    assert rejected[0]["level"] == "warning" and rejected[0]["status"] == 404
    assert rejected[0]["error"] == "ModelNotFound" and "exc" not in rejected[0]
    assert not [e for e in mine if e["level"] == "error"], mine
