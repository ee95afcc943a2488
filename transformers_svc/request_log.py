"""Opt-in request log of the transformer: one JSON object per line per request, in its own rotating
file (`--request-log PATH`), never on stderr with the service logs.

Each line: ts, request_id, tenant, route, protocol, status (HTTP-like code), cache (one status per
prompt), latency_ms, prompt_sha256 (one per prompt). Prompts are hashed, not written: the hash lets
an auditor match a request to a prompt they already have (or to other requests with the same one)
without the log becoming a copy of every tenant's data. Short, guessable prompts can be recovered
from a plain hash by trying candidates; that is accepted for an audit trail, and whoever needs
more uses `--record-prompt-text`, which adds the request's prompts and sampling and the answers' text.

It listens to the request path: the v2 model and the OpenAI backend hand it a RequestRecord
(transformers_svc/request_context.py) as each request ends (a stream: when it ends, with the
status it ended with).
"""

from __future__ import annotations

import hashlib
import json
import logging
import logging.handlers
import time
from pathlib import Path
from typing import Any

from semserve.logs import request_id_var
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import RequestRecord

LOGGER = "semserve.request_log"


def prompt_hash(prompt: str) -> str:
    # surrogatepass: a prompt with a lone surrogate (valid JSON, invalid UTF-8) must hash, not raise.
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()


class RequestLog:
    """Writes request lines to a size-rotated file. Disabled (every call a no-op) without a path."""

    def __init__(self, path: Path | None, *, full: bool = False, max_bytes: int = 100 * 2**20,
                 backups: int = 5, default_tenant: str = "default") -> None:
        self.full = full
        self.default_tenant = default_tenant
        self._logger: logging.Logger | None = None
        if path is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A logger of its own that does not propagate: full records hold prompts and answers and
        # must never reach the service log (stderr, collected by the cluster's log pipeline).
        logger = logging.getLogger(f"{LOGGER}.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", errors="backslashreplace"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.handlers[:] = [handler]
        self._logger = logger

    @classmethod
    def from_settings(cls, settings: TransformerSettings) -> RequestLog:
        return cls(settings.request_log, full=settings.record_prompt_text,
                   max_bytes=settings.request_log_max_bytes, backups=settings.request_log_backups,
                   default_tenant=settings.tenant)

    @property
    def enabled(self) -> bool:
        return self._logger is not None

    def on_outcome(self, record: RequestRecord) -> None:
        """The listener the request path calls as each request ends."""
        if self._logger is None:
            return
        ctx = record.context
        request: dict[str, Any] = {}
        if record.parameters is not None:
            request["parameters"] = record.parameters
        if record.body is not None and self.full:
            request["body"] = record.body.model_dump(exclude_none=True, mode="json")
        self.record(
            route=ctx.route, protocol=ctx.protocol, status=record.status, cache=record.cache,
            started=ctx.started, prompts=record.prompts, request_id=ctx.request_id, tenant=ctx.tenant,
            request=request or None, answers=record.answers, error=record.error,
        )

    def record(
        self,
        *,
        route: str,
        protocol: str,
        status: int,
        cache: list[str],
        started: float,
        prompts: list[str],
        request_id: str | None = None,
        tenant: str | None = None,
        request: dict[str, Any] | None = None,
        answers: list[str] | None = None,
        error: str | None = None,
    ) -> None:
        if self._logger is None:
            return
        now = time.time()
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z",
            "request_id": request_id or request_id_var.get() or "",
            "tenant": tenant or tenant_var.get() or self.default_tenant,
            "route": route,
            "protocol": protocol,
            "status": status,
            "cache": cache,
            "latency_ms": round((time.monotonic() - started) * 1000.0, 2),
            "prompt_sha256": [prompt_hash(p) for p in prompts],
        }
        if error is not None:
            entry["error"] = error[:500]
        if self.full:
            entry["request"] = {"prompts": prompts, **(request or {})}
            entry["response"] = {"texts": answers or []}
        try:
            self._logger.info(json.dumps(entry, ensure_ascii=False, default=str))
        except Exception:  # a log write (disk full, ...) must not fail the request it records
            logging.getLogger(LOGGER).exception("request_log_write_failed")
