"""Transformer settings (SEMSERVE_TRANSFORMER_*). The cache, embedder and verifier keep their own
settings classes in cache/; on the command line they appear as --cache-*, --embed-*, --verify-*.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semserve.config import OpenAIRouteSettings, setting


@dataclass
class TransformerSettings(OpenAIRouteSettings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_TRANSFORMER_"

    model_name: str = setting("llm", "Model name served; must equal the predictor's (KServe sets it).")
    host: str = setting("127.0.0.1", "Address to bind (0.0.0.0 in a container).")
    http_port: int = setting(8080, "HTTP port: v2 REST, OpenAI routes, admin routes, /metrics.")
    grpc_port: int = setting(8081, "gRPC port: v2 GRPCInferenceService (0 disables gRPC).")
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
    predictor_connect_timeout_s: float = setting(
        2.0, "Longest to wait for a connection to the predictor before answering 503."
    )
    tenant: str = setting("default", "Tenant of every request when auth is off.")
    api_keys_file: Path | None = setting(
        None,
        "JSON file {tenant: [\"sha256:<hex of key>\", ...]}; when set, every route needs a key "
        "(Authorization: Bearer KEY or x-api-key) and the tenant comes from the key alone.",
    )
    admin_keys_file: Path | None = setting(
        None, "JSON list [\"sha256:<hex>\", ...] of admin keys for /admin/* when auth is on."
    )
    cache_policy: str = setting(
        "deterministic",
        "Which requests use the cache by default: deterministic (temperature 0), all, or off. "
        "Clients opt out per request with Cache-Control: no-cache / no-store.",
        choices=("deterministic", "all", "off"),
    )
    model_revision: str = setting(
        "",
        "Model revision in the cache key, so answers of another revision are never served; answers "
        "the predictor reports as another revision's are served but not stored.",
    )
    max_body_bytes: int = setting(4 * 1024 * 1024, "Largest request body accepted; larger gets 413.")
    max_header_bytes: int = setting(
        64 * 1024, "Largest HTTP request head (request line + headers) accepted; larger gets 431."
    )
    max_batch_size: int = setting(64, "Most prompts one v2 request may carry.")
    default_max_tokens: int = setting(128, "max_tokens when a request gives none (as the predictor).")
    grace_period_s: float = setting(30.0, "On SIGTERM, how long in-flight requests may take to finish.")
    workers: int = setting(1, "Accepted for KServe's --workers; this server runs one process.")
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    audit_log: Path | None = setting(
        None,
        "Audit log file (JSON lines: time, request id, tenant, route, cache status, latency, prompt "
        "sha256); empty: no audit log.",
    )
    audit_full: bool = setting(
        False, "Also write each request's prompts and parameters and the answers' text to the audit log."
    )
    audit_max_bytes: int = setting(100 * 1024 * 1024, "Audit log size at which it is rotated.")
    audit_backups: int = setting(5, "Rotated audit log files kept (PATH.1 ... PATH.N).")
