"""A real Prometheus (Debian's) scraping the suite's predictor and transformer under a short load:
every dashboard query returns data, and every recording and alerting rule evaluates without error.
A second transformer with a tenant limit (one request a minute) is scraped too, and pushed over it,
so the Tenants row's refusals have series.

The scrape targets carry the labels the PodMonitors give them in a cluster (job, namespace,
serving_kserve_io_inferenceservice), so the queries run exactly as the dashboard sends them."""

from __future__ import annotations

import math
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import FRANCE, LOG_DIR, Predictor, Transformer, start_transformer
from tests.prometheus import binary, dashboard_queries, write_rules
from tests.support import free_port

NAMESPACE = "local"
SCRAPE_S = 1


def _target(job: str, *http_urls: str) -> dict:
    return {
        "job_name": job,
        "scrape_interval": f"{SCRAPE_S}s",
        "static_configs": [{
            "targets": [url.removeprefix("http://") for url in http_urls],
            "labels": {"namespace": NAMESPACE, "serving_kserve_io_inferenceservice": "local"},
        }],
    }  # fmt: skip


@pytest.fixture(scope="module")
def limited(
    predictor: Predictor, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Transformer]:
    """A second transformer with a tenant limit of one request a minute, so that the Tenants row's
    refusals have series: the suite's transformer has no limits file."""
    limits = tmp_path_factory.mktemp("limits") / "limits.json"
    limits.write_text('{"default": {"requests_per_minute": 1}}')
    t = start_transformer("prom-limits", predictor.grpc, redis_url, "--tenant-limits-file", str(limits))
    try:
        yield t
    finally:
        t.process.stop()


@pytest.fixture(scope="module")
def prometheus(
    predictor: Predictor,
    transformer: Transformer,
    limited: Transformer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    work: Path = tmp_path_factory.mktemp("prometheus")
    write_rules(work / "rules.yaml", interval_s=SCRAPE_S)
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(work / "rules.yaml")],
        "scrape_configs": [
            _target("semserve-predictor", predictor.http),
            _target("semserve-transformer", transformer.http, limited.http),
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with (LOG_DIR / "prometheus.log").open("ab") as log:
        proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"prometheus exited; see {LOG_DIR / 'prometheus.log'}"
            try:
                if httpx.get(f"{base}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def _load(predictor: Predictor, transformer: Transformer) -> None:
    """A short mixed load: chat misses and their exact repeats, a paraphrase, v2 and a stream."""
    ref = uuid.uuid4().hex[:6]
    for q in (f"What is the capital of Italy? ({ref})", f"Name a large ocean. ({ref})"):
        for _ in range(2):  # a miss, then an exact hit
            body = {"model": "llm", "messages": [{"role": "user", "content": q}], "temperature": 0,
                    "max_tokens": 8}  # fmt: skip
            r = httpx.post(f"{transformer.openai_base}/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
    v2 = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [FRANCE]}],
          "parameters": {"max_tokens": 8, "temperature": 0}}  # fmt: skip
    assert httpx.post(f"{transformer.http}/v2/models/llm/infer", json=v2, timeout=120).status_code == 200
    stream = {"model": "llm", "messages": [{"role": "user", "content": f"Count to three. ({ref})"}],
              "temperature": 0, "max_tokens": 8, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{predictor.openai_base}/chat/completions", json=stream, timeout=120) as r:
        assert r.status_code == 200
        r.read()


def _over_the_limit(limited: Transformer) -> None:
    """A miss the limit admits, then calls it refuses (429): the Tenants row's series."""
    ref = uuid.uuid4().hex[:6]
    codes = []
    for i in range(3):
        body = {"model": "llm", "messages": [{"role": "user", "content": f"Name a colour. ({ref}{i})"}],
                "temperature": 0, "max_tokens": 4}  # fmt: skip
        r = httpx.post(f"{limited.openai_base}/chat/completions", json=body, timeout=120)
        codes.append(r.status_code)
    assert 429 in codes and set(codes) <= {200, 429}, codes


def _query(base: str, expr: str) -> list[dict]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=30)
    assert r.status_code == 200, f"{expr}: {r.text}"
    return r.json()["data"]["result"]


def _has_data(result: list[dict]) -> bool:
    return any(not math.isnan(float(s["value"][1])) for s in result)


def _scraped(base: str, job: str, times: int) -> bool:
    result = _query(base, f'count_over_time(up{{job="{job}"}}[5m]) >= {times}')
    return bool(result)


def test_every_dashboard_query_returns_data(
    prometheus: str, predictor: Predictor, transformer: Transformer, limited: Transformer
) -> None:
    # Rates need samples before the load: a counter's first sample is no increase.
    deadline = time.monotonic() + 60
    while not all(_scraped(prometheus, j, 3) for j in ("semserve-predictor", "semserve-transformer")):
        assert time.monotonic() < deadline, "prometheus did not scrape both targets 3 times in 60 s"
        time.sleep(SCRAPE_S)
    _load(predictor, transformer)
    _over_the_limit(limited)
    queries = dashboard_queries(NAMESPACE)
    assert len(queries) >= 15
    # A labelled series is born at its first observation, and its first sample is no increase to
    # rate(): a second round, after a scrape, is what a stack under steady traffic looks like.
    time.sleep(3 * SCRAPE_S)
    _load(predictor, transformer)
    _over_the_limit(limited)
    empty: list[str] = []
    deadline = time.monotonic() + 40
    while True:
        empty = [f"{title}: {expr}" for title, expr in queries if not _has_data(_query(prometheus, expr))]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(2 * SCRAPE_S)
    exported = sorted({
        line.split("{")[0].split(" ")[0]
        for line in httpx.get(f"{predictor.http}/metrics", timeout=30).text.splitlines()
        if line.startswith("vllm:")
    })  # fmt: skip
    counts = [
        line for line in httpx.get(f"{transformer.http}/metrics", timeout=30).text.splitlines()
        if line.startswith("semserve_transformer_request_duration_seconds_count")
    ]  # fmt: skip
    stored = _query(prometheus, "semserve_transformer_request_duration_seconds_count[1m]")
    missing = "\n".join(empty) + f"\ntransformer: {counts}\nprometheus: {stored}"
    assert not empty, f"dashboard queries without data:\n{missing}\npredictor's vllm:* {exported}"


def test_rules_evaluate_without_error(prometheus: str) -> None:
    # After the dashboard test's load (same module-scoped Prometheus).
    time.sleep(3 * SCRAPE_S)
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 8
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # The recording rule the hit-ratio panel and alert read has a value for the local stack.
    assert _has_data(_query(prometheus, f'semserve:cache_hit_ratio:rate30m{{namespace="{NAMESPACE}"}}'))
