"""Transformer settings (SEMSERVE_TRANSFORMER_*). The cache, embedder and verifier keep their own
settings classes in cache/; on the command line they appear as --cache-*, --embed-*, --verify-*.
What both services have (ports 8080/8081, KServe's, among them) comes from ServerSettings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semserve.config import ServerSettings, setting


@dataclass
class TransformerSettings(ServerSettings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_TRANSFORMER_"

    predictor_host: str = setting(
        "127.0.0.1:8091",
        "Predictor gRPC address (host:port): every miss, v2 or OpenAI, streamed or not, goes there "
        "(ModelInfer / ModelStreamInfer), the one port Knative routes to the predictor.",
    )
    predictor_protocol: str = setting(
        "grpc-v2",
        "Accepted for the flag KServe passes to transformers; the only protocol to the predictor is "
        "grpc-v2 (v2 over gRPC, streaming included).",
        choices=("grpc-v2",),
    )
    predictor_timeout_s: float = setting(120.0, "Longest a miss may wait for the predictor.")
    tenant: str = setting("default", "Tenant of every request when auth is off.")
    api_keys_file: Path | None = setting(
        None,
        "JSON file {tenant: [\"sha256:<hex of key>\", ...]}; when set, every route needs a key "
        "(Authorization: Bearer KEY or x-api-key) and the tenant comes from the key alone.",
    )
    tenant_limits_file: Path | None = setting(
        None,
        "JSON file {tenant or \"default\": {requests_per_minute, tokens_per_minute, max_concurrent, "
        "weight}}: per-tenant limits shared by all replicas through the cache's Redis (429 with "
        "Retry-After when over one). Re-read when it changes (a ConfigMap update reaches running "
        "pods); a bad file stops the transformer at start, a bad new version keeps the old limits.",
    )
    admin_keys_file: Path | None = setting(
        None, "JSON list [\"sha256:<hex>\", ...] of admin keys for /admin/* when auth is on."
    )
    cache_policy: str = setting(
        "deterministic",
        "Which requests use the cache by default: deterministic (temperature 0), all, or off (no "
        "cache at all: no Redis). Clients opt out per request with Cache-Control: no-cache / no-store.",
        choices=("deterministic", "all", "off"),
    )
    expected_model_revision: str = setting(
        "",
        "The model revision this transformer expects of the predictor: part of the cache key, so "
        "answers of another revision are never served; answers the predictor reports as another "
        "revision's (its --model-revision) are served but not stored.",
    )
    workers: int = setting(1, "Accepted for KServe's --workers; this server runs one process.")
    request_log: Path | None = setting(
        None,
        "Request log file (JSON lines: time, request id, tenant, route, cache status, latency, "
        "prompt sha256); empty: no request log.",
    )
    record_prompt_text: bool = setting(
        False,
        "Let prompt and answer text into telemetry: the request log (prompts, parameters, answers), "
        "the verifier's decision log line and the cache lookup span. Off: only hashes leave the process.",
    )
    request_log_max_bytes: int = setting(100 * 1024 * 1024, "Request log size at which it is rotated.")
    request_log_backups: int = setting(5, "Rotated request log files kept (PATH.1 ... PATH.N).")
    speculate: bool = setting(
        True,
        "Speculation for streamed misses: when the exact lookup misses, start the predictor stream at "
        "once, while the embedding, KNN and verifier run; a semantic hit cancels it (the predictor "
        "aborts; never stored), a miss streams it. Only while the predictor is warm (see "
        "--speculate-warm-window-s), so a hit never wakes a predictor at zero. --no-speculate turns it off.",
    )
    speculate_unary: bool = setting(
        False,
        "With --speculate: requests that are not streamed speculate too, and a miss is answered from "
        "its speculation. Measured with the transformer on a core of its own: a unary v2 miss +6.3-6.5 "
        "ms over a direct call instead of +10.7-12.4 ms, a semantic hit +1.1-1.2 ms (bench/RESULTS.md, "
        "Stop 38). Off by default: a unary answer waits for its whole generation, beside which the "
        "lookup is small, while every semantic hit would cost the predictor a cancelled prefill.",
    )
    speculate_warm_window_s: float = setting(
        30.0,
        "The predictor counts as warm, and misses speculate, for this long after it last "
        "answered this transformer (any successful call); shorter than the predictor's "
        "scale-to-zero idle time.",
    )
    predictor_hold_s: float = setting(
        0.0,
        "How long a miss may wait for a predictor that is not ready (starting, restarting, at zero): "
        "0 refuses it at once with 503, as before; above 0 it is held until the predictor is ready "
        "(asked over gRPC ServerReady), then sent, or 503 after this long. With holding on, streamed "
        "OpenAI requests get SSE comments (--sse-keepalive-s) and each tenant may hold at most "
        "--held-misses-per-tenant. A predictor counts as ready while it answered within "
        "--speculate-warm-window-s and its gRPC channel is connected.",
    )
    sse_keepalive_s: float = setting(
        5.0,
        "With --predictor-hold-s on: a streamed OpenAI request with no first token after this long "
        "gets its response started (200, headers) and an SSE comment line (': ...', ignored by "
        "OpenAI clients) this often until its first token, so proxies keep the connection; an error "
        "after that comes as an SSE error event. 0: no comments. v2 streams get nothing until tokens.",
    )
    held_misses_per_tenant: int = setting(
        16,
        "With --predictor-hold-s on: the most misses one tenant may have held at once; past it a "
        "miss gets 503 with Retry-After (the predictor's start time left). Hits are always answered.",
    )
    predictor_start_s: float = setting(
        19.9,
        "The predictor's expected time from the first held miss to ready, for Retry-After until this "
        "transformer has measured one (then the last measured); default: bench/RESULTS.md's warm "
        "start on CPU (2026-12-05, engine core in the predictor's process, vLLM's AOT cache).",
    )
    fair_admission: bool = setting(
        True,
        "Token-fair admission of misses (transformers_svc/fair_queue.py, VTC): misses wait here while "
        "the predictor has no room (--fair-max-waiting, --fair-max-kv-cache-usage, read from its "
        "metrics) and go in the order of their tenants' weighted token counters; a miss that would "
        "wait over --fair-max-wait-s is refused at once (429 fair_share / 503). --no-fair-admission: "
        "every miss goes straight to the predictor.",
    )
    predictor_metrics_url: str = setting(
        "",
        "The predictor's Prometheus endpoint, read for its room (vllm:num_requests_waiting, "
        "vllm:kv_cache_usage_perc); empty: http://<predictor host>:<its gRPC port - 1>/metrics (port "
        "80 kept). Unreadable: one warning, and fair admission admits every miss (fail open).",
    )
    fair_poll_s: float = setting(
        0.1, "How often the predictor's metrics are read (sooner, at most every 20 ms, while misses wait)."
    )
    fair_max_waiting: int = setting(
        2,
        "The predictor has room while its waiting requests plus the misses this transformer admitted "
        "since its last read are below this.",
    )
    fair_max_kv_cache_usage: float = setting(
        0.95, "The predictor has room while its KV cache use (0-1) is at most this."
    )
    fair_reserve: int = setting(
        1,
        "Places of the predictor's batch (once its size is learned) kept for tenants with no miss in "
        "flight: a tenant with misses in flight fills the batch only to its size minus this, so a "
        "quiet tenant's miss starts at once instead of waiting for a place to free: vLLM preempts "
        "nothing for a full batch (0: none).",
    )
    fair_max_wait_s: float = setting(
        60.0,
        "A miss whose estimated wait in the fair queue (misses ahead / measured admission rate) is "
        "over this is refused at once with Retry-After: 429 (fair_share) when its tenant holds more "
        "than its weighted share of the predictor, else 503.",
    )
