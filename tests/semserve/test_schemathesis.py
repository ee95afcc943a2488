"""Schemathesis against the OpenAPI document each real service serves: for every operation both
services list (KServe's v1/v2 routes, our OpenAI routes, the transformer's admin routes), generated
requests, valid and invalid (examples, coverage and fuzzing phases; positive and negative modes), go
over real sockets to the running predictor (vLLM) and transformer (Redis cache in front of it).

Fails on any 5xx, on an answer (a stream included) that takes longer than RESPONSE_BOUND_S, on a
connection error, and on a server that is no longer alive and answering afterwards or whose memory grew
past a bound. tests/semserve/test_hostile_input.py covers the same ground with hand-written strategies; this
file covers what the documents say the services accept, operation by operation.

The same cases every run: a fixed seed and derandomized generation, no example database on disk.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import pytest
import requests
import schemathesis
from schemathesis.checks import not_a_server_error

from tests.conftest import Predictor, Transformer

SEED = 20_240_611
# Per operation for the fuzzing phase; the coverage phase adds its own boundary cases on top.
MAX_EXAMPLES = 15
# A hang: no whole answer within this (a 2-token generation takes well under a second here).
RESPONSE_BOUND_S = 60.0
# Every generated completion costs vLLM time on 2 shared cores, and a body without max_tokens gets the
# services' default of 128 tokens. Our request models document no upper bound for max_tokens (the
# services have none but the context length), so `_cap_generation` caps it here instead.
MAX_TOKENS = 2
RSS_GROWTH_LIMIT = 300 * 1024 * 1024
# The name both fixtures serve (their default --model-name). Random path names only ever reach
# KServe's 404; half the `{model_name}` paths name the served model instead, so load/unload, v1
# predict/explain and v2 infer/metadata run against the real model too.
SERVED_MODEL = "llm"

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": SEED,
        "suppress-health-check": ["all"],
        "request-timeout": RESPONSE_BOUND_S,
        "generation": {
            "mode": "all",  # positive and negative (fuzzed) cases
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        # Stateful links would chain operations; ours have none worth following (no created resources).
        "phases": {"stateful": {"enabled": False}},
        "dictionaries": {"served": {"values": [SERVED_MODEL]}},
        "parameters": {"path.model_name": {"dictionary": "served", "probability": 0.5}},
    }
)


@dataclass
class Target:
    """One running service, what was sent to it and how its memory stood before."""

    name: str
    http: str
    pid: int
    rss_start: int = 0
    # Status codes answered, per operation label.
    cases: dict[str, collections.Counter[int]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    # (phase, mode) of each case: examples/coverage/fuzzing, positive/negative.
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.rss_start = psutil.Process(self.pid).memory_info().rss

    def summary(self) -> str:
        ops = "\n".join(
            f"    {sum(codes.values()):4d}  {label}  {dict(sorted(codes.items()))}"
            for label, codes in sorted(self.cases.items())
        )
        total = sum(sum(codes.values()) for codes in self.cases.values())
        return (
            f"{self.name}: {total} cases over {len(self.cases)} operations, {self.seconds:.0f}s waiting "
            f"for answers; {dict(self.kinds)}\n{ops}"
        )


def _target(name: str, http: str, process: Any) -> Target:
    assert process.proc is not None
    return Target(name, http, process.proc.pid)


@pytest.fixture(scope="session")
def predictor_target(predictor: Predictor) -> Target:
    return _target("predictor", predictor.http, predictor.process)


@pytest.fixture(scope="session")
def transformer_target(transformer: Transformer) -> Target:
    return _target("transformer", transformer.http, transformer.process)


def _load(target: Target) -> schemathesis.BaseSchema:
    # The document the running server itself serves, over HTTP: what a client would read.
    return schemathesis.openapi.from_url(f"{target.http}/openapi.json", config=CONFIG, timeout=30)


@pytest.fixture(scope="session")
def predictor_api(predictor_target: Target) -> schemathesis.BaseSchema:
    return _load(predictor_target)


@pytest.fixture(scope="session")
def transformer_api(transformer_target: Target) -> schemathesis.BaseSchema:
    return _load(transformer_target)


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32's lazy loader (`from_fixture`) reads and relabels `node._nodeid`, which pytest
    # 9.2 replaced with a structured id (the same break as pytest-benchmark#321). Its relabelling only
    # names the reports; the operation is in each subtest's label anyway.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


predictor_schema = schemathesis.pytest.from_fixture("predictor_api")
transformer_schema = schemathesis.pytest.from_fixture("transformer_api")


def _tokens(value: Any) -> float | None:
    """The number a token-count field would parse to (pydantic's lax mode takes "7" and 7.0), or None
    when it is no number at all (the server must reject it, and that costs nothing)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _cap_generation(case: schemathesis.Case) -> None:
    """Keep any completion the case may start at MAX_TOKENS (see MAX_TOKENS). Only counts above the
    cap change, so invalid counts (0, -1, "x", true) still reach the server as generated."""
    if not case.path.endswith(("completions", "responses")) or not isinstance(case.body, dict):
        return
    body = case.body
    # A response's count is max_output_tokens (max_tokens there is refused, costing nothing).
    responses = case.path.endswith("responses")
    keys = ("max_output_tokens",) if responses else ("max_tokens", "max_completion_tokens")
    if all(body.get(key) is None for key in keys):
        body[keys[0]] = MAX_TOKENS
    for key in keys:
        n = _tokens(body.get(key))
        if n is not None and (math.isinf(n) or n > MAX_TOKENS):
            body[key] = MAX_TOKENS


def _exercise(case: schemathesis.Case, target: Target) -> None:
    _cap_generation(case)
    label = case.operation.label
    started = time.monotonic()
    try:
        # A fresh connection per case: a kept-alive one the server closes as idle while hypothesis
        # shrinks would fail on the client's side, which is no fault of the server's.
        response = case.call(base_url=target.http, headers={"connection": "close"}, timeout=RESPONSE_BOUND_S)
    except requests.Timeout as exc:
        raise AssertionError(f"{target.name} {label}: no answer within {RESPONSE_BOUND_S}s") from exc
    except requests.ConnectionError as exc:
        raise AssertionError(f"{target.name} {label}: connection failed: {exc}") from exc
    elapsed = time.monotonic() - started
    target.cases[label][response.status_code] += 1
    meta = case.meta
    target.kinds[f"{meta.phase.name.value}/{meta.generation.mode.value}" if meta else "explicit"] += 1
    target.seconds += elapsed
    # Only the server-error check: the documents (FastAPI's) promise 422 for validation errors where
    # the services answer 400, and list no error responses; conformance is not what this file judges.
    case.validate_response(response, checks=[not_a_server_error])
    # An event stream that went silent or never ended is cut short at the timeout, not raised.
    assert not response.stream_cut_short, f"{target.name} {label}: the stream did not end"
    assert elapsed < RESPONSE_BOUND_S, f"{target.name} {label}: answered after {elapsed:.0f}s"


def test_documents_describe_our_routes(predictor_api: Any, transformer_api: Any) -> None:
    # What clients use must be listed, with the bodies and query parameters our routes parse by hand
    # (or schemathesis would send them nothing to parse).
    for api in (predictor_api, transformer_api):
        paths = api.raw_schema["paths"]
        for route in ("/openai/v1/completions", "/openai/v1/chat/completions"):
            body = paths[route]["post"].get("requestBody", {})
            assert "application/json" in body.get("content", {}), f"{route} documents no JSON body"
    inspect = transformer_api.raw_schema["paths"]["/admin/cache/inspect"]["get"]
    assert {p["name"] for p in inspect.get("parameters", [])} == {"tenant", "limit"}


@predictor_schema.parametrize()
def test_predictor_api(case: schemathesis.Case, predictor_target: Target) -> None:
    _exercise(case, predictor_target)


@transformer_schema.parametrize()
def test_transformer_api(case: schemathesis.Case, transformer_target: Target) -> None:
    _exercise(case, transformer_target)


def _still_serving(target: Target) -> None:
    proc = psutil.Process(target.pid)
    assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE, f"{target.name} exited"
    with httpx.Client(base_url=target.http, timeout=RESPONSE_BOUND_S) as client:
        for probe in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{SERVED_MODEL}/ready"):
            r = client.get(probe)
            assert r.status_code == 200, f"{target.name} {probe}: {r.status_code} {r.text[:200]}"
        r = client.post("/openai/v1/completions", json={
            "model": SERVED_MODEL, "prompt": "Say hi.", "max_tokens": MAX_TOKENS, "temperature": 0,
        })
        assert r.status_code == 200, f"{target.name} completion: {r.status_code} {r.text[:300]}"
    growth = proc.memory_info().rss - target.rss_start
    assert growth < RSS_GROWTH_LIMIT, f"{target.name} RSS grew by {growth / 2**20:.0f} MiB"
    print(f"\n{target.summary()}")


# Definition order: each runs after its service's generated cases.
def test_predictor_still_serving(predictor_target: Target) -> None:
    assert predictor_target.cases, "no case reached the predictor"
    _still_serving(predictor_target)


def test_transformer_still_serving(transformer_target: Target) -> None:
    assert transformer_target.cases, "no case reached the transformer"
    _still_serving(transformer_target)


