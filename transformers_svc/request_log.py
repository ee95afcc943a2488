"""Opt-in audit log of the transformer: one JSON object per line per request, in its own rotating
file (`--audit-log PATH`), never on stderr with the service logs.

Each line: ts, request_id, tenant, route, protocol, status (HTTP-like code), cache (one status per
prompt), latency_ms, prompt_sha256 (one per prompt). Prompts are hashed, not written: the hash lets
an auditor match a request to a prompt they already have (or to other requests with the same one)
without the log becoming a copy of every tenant's data. Short, guessable prompts can be recovered
from a plain hash by trying candidates; that is accepted for an audit trail, and whoever needs
more uses `--audit-full`, which adds the request's prompts and sampling and the answers' text.

The hooks are one call each: `AuditedTransformer.predict` (v2 REST and gRPC) and `AuditedOpenAI`
around the OpenAI backend (completions and chat, streaming included: a stream is recorded when it
ends, with the status it ended with).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import logging.handlers
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kserve import InferRequest, InferResponse
from kserve.errors import InvalidInput, ModelNotFound, ServerNotReady

from semserve import openai_protocol as oa
from semserve import v2
from semserve.errors import ServingError
from semserve.logs import request_id_var
from semserve.openai_routes import RequestContext
from transformers_svc.auth import tenant_var
from transformers_svc.model import CACHE_STATUS, SemanticCacheTransformer


def prompt_hash(prompt: str) -> str:
    # surrogatepass: a prompt with a lone surrogate (valid JSON, invalid UTF-8) must hash, not raise.
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()


class AuditLog:
    """Writes audit lines to a size-rotated file. Disabled (every call a no-op) without a path."""

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
        logger = logging.getLogger(f"semserve.audit.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", errors="backslashreplace"
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.handlers[:] = [handler]
        self._logger = logger

    @property
    def enabled(self) -> bool:
        return self._logger is not None

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
            "tenant": tenant_var.get() or self.default_tenant,
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
        except Exception:  # an audit write (disk full, ...) must not fail the request it records
            logging.getLogger("semserve.audit").exception("audit_write_failed")


def _v2_prompts(payload: Any) -> list[str]:
    try:
        inp = payload.get_input_by_name("text_input")
        values = [] if inp is None else list(inp.as_numpy().reshape(-1))
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]
    except Exception:  # a malformed request is audited as what could be read of it: nothing
        return []


def _column(response: InferResponse, name: str) -> list[str]:
    out = response.get_output_by_name(name)
    if out is None:
        return []
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in out.as_numpy().reshape(-1)]


def _v2_status(exc: BaseException) -> int:
    """The HTTP status KServe answers for what predict raised."""
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, ModelNotFound):
        return 404
    if isinstance(exc, ServerNotReady):
        return 503
    if isinstance(exc, asyncio.CancelledError):
        return 499
    return 500


class AuditedTransformer(SemanticCacheTransformer):
    """The transformer's v2 model, recording each predict in the audit log."""

    audit: AuditLog

    async def predict(
        self,
        payload: InferRequest | dict[str, Any],
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        started = time.monotonic()
        from_grpc = getattr(payload, "from_grpc", False)
        route = f"/v2/models/{self.name}/infer"
        prompts = _v2_prompts(payload) if isinstance(payload, InferRequest) else []
        rid = getattr(payload, "id", None) or {k.lower(): v for k, v in (headers or {}).items()}.get(
            "x-request-id")
        try:
            response = await super().predict(payload, headers, response_headers)
        except BaseException as exc:
            status = _v2_status(exc)
            self.audit.record(route=route, protocol="v2-grpc" if from_grpc else "v2-rest", status=status,
                              cache=[], started=started, prompts=prompts, request_id=rid,
                              error=f"{type(exc).__name__}: {exc}")
            raise
        self.audit.record(
            route=route, protocol="v2-grpc" if from_grpc else "v2-rest", status=200,
            cache=_column(response, CACHE_STATUS), started=started, prompts=prompts, request_id=rid,
            request={"parameters": dict(payload.parameters or {}) if isinstance(payload, InferRequest)
                     and not from_grpc else {}},
            answers=_column(response, "text_output"),
        )
        return response

    async def infer_stream(
        self, payload: InferRequest, headers: dict[str, str]
    ) -> AsyncIterator[v2.StreamPart]:
        # Whole answers (no `stream` input) go through predict and are recorded there; a stream is
        # recorded once it ends, with the status it ended with.
        streamed = _wants_stream(payload)
        started = time.monotonic()
        protocol = "v2-grpc" if payload.from_grpc else "v2-rest"
        prompts = _v2_prompts(payload)
        statuses: list[str] = []
        texts: dict[int, list[str]] = {}
        status, error = 200, None
        try:
            async for part in super().infer_stream(payload, headers):
                if streamed:
                    cache = _column(part.response, CACHE_STATUS)
                    for i, text in enumerate(_column(part.response, "text_output")):
                        texts.setdefault(i, []).append(text)
                    statuses = [c or (statuses[i] if i < len(statuses) else "") for i, c in enumerate(cache)]
                yield part
        except BaseException as exc:
            status, error = _v2_status(exc), f"{type(exc).__name__}: {exc}"
            if isinstance(exc, GeneratorExit):
                status = 499
            raise
        finally:
            if streamed:
                self.audit.record(
                    route=f"/v2/models/{self.name}/stream", protocol=protocol, status=status,
                    cache=statuses, started=started, prompts=prompts, request_id=payload.id or None,
                    answers=["".join(texts[i]) for i in sorted(texts)], error=error,
                )


def _wants_stream(payload: InferRequest) -> bool:
    try:
        return v2.parse_request(payload, max_batch=2**31).stream
    except Exception:  # a request that does not parse fails in predict's path and is recorded there
        return False


class AuditedOpenAI:
    """The OpenAI backend (semserve.openai_routes.OpenAIBackend), recording each request."""

    def __init__(self, inner: Any, audit: AuditLog) -> None:
        self.inner = inner
        self.audit = audit

    def models(self) -> list[oa.OpenAIModelCard]:
        return self.inner.models()

    async def completions(self, req: oa.CompletionRequest, ctx: RequestContext) -> Any:
        return await self._call(self.inner.completions, req, ctx, "/openai/v1/completions", req.prompts)

    async def chat_completions(self, req: oa.ChatCompletionRequest, ctx: RequestContext) -> Any:
        last = req.messages[-1].text if req.messages else ""
        return await self._call(self.inner.chat_completions, req, ctx, "/openai/v1/chat/completions", [last])

    async def _call(self, fn: Any, req: Any, ctx: RequestContext, route: str, prompts: list[str]) -> Any:
        started = time.monotonic()
        request = {"body": req.model_dump(exclude_none=True, mode="json")} if self.audit.full else None

        def record(status: int, answers: list[str], error: str | None = None) -> None:
            cache = ctx.response_headers.get("x-semserve-cache", "")
            self.audit.record(route=route, protocol="openai", status=status,
                              cache=cache.split(",") if cache else [], started=started, prompts=prompts,
                              request_id=ctx.request_id, request=request, answers=answers, error=error)

        try:
            result = await fn(req, ctx)
        except ServingError as exc:
            record(exc.http_status, [], exc.message)
            raise
        except BaseException as exc:
            record(500, [], f"{type(exc).__name__}: {exc}")
            raise
        if hasattr(result, "__aiter__"):
            return self._stream(result, record)
        record(200, _texts(result))
        return result

    async def _stream(self, stream: AsyncIterator[Any], record: Any) -> AsyncIterator[Any]:
        pieces: list[str] = []
        status, error = 200, None
        try:
            async for chunk in stream:
                pieces.extend(_texts(chunk))
                yield chunk
        except ServingError as exc:
            status, error = exc.http_status, exc.message
            raise
        except BaseException as exc:  # client gone (cancelled) or a failure mid-stream
            gone = isinstance(exc, GeneratorExit | asyncio.CancelledError)
            status, error = 499 if gone else 500, type(exc).__name__
            raise
        finally:
            record(status, ["".join(pieces)], error)


def _texts(obj: Any) -> list[str]:
    out = []
    for choice in getattr(obj, "choices", None) or []:
        message = getattr(choice, "message", None) or getattr(choice, "delta", None)
        text = getattr(message, "content", None) if message is not None else getattr(choice, "text", None)
        if text:
            out.append(text)
    return out


def from_settings(settings: Any) -> AuditLog:
    return AuditLog(settings.audit_log, full=settings.audit_full, max_bytes=settings.audit_max_bytes,
                    backups=settings.audit_backups, default_tenant=settings.tenant)
