"""Admin HTTP routes over the cache (the same operations as `semserve cache ...`), protected by an
admin key when auth is on."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cache.semantic_cache import SemanticCache
from semserve.errors import BadRequest, ServingError, Unavailable
from transformers_svc.auth import Authenticator


def register_admin_routes(app: FastAPI, cache: SemanticCache | None, auth: Authenticator) -> None:
    async def guarded(request: Request, op: Any) -> JSONResponse:
        try:
            auth.check_admin({k.lower(): v for k, v in request.headers.items()})
            if cache is None:
                raise Unavailable("the cache is disabled")
            return JSONResponse(await op())
        except ServingError as exc:
            return JSONResponse(status_code=exc.http_status, content={"error": exc.message})
        except Exception as exc:  # Redis down: an admin gets a clear 503, not a traceback
            return JSONResponse(status_code=503, content={"error": f"cache unavailable: {exc}"})

    def tenant_param(request: Request) -> str:
        tenant = request.query_params.get("tenant", "")
        if not tenant:
            raise BadRequest("query parameter 'tenant' is required", "tenant")
        return tenant

    async def stats(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            result = await cache.entries.stats(request.query_params.get("tenant") or None)
            return {**result, "counters": _counters(cache), "epoch": _epochs(cache)}

        return await guarded(request, op)

    async def bump_epoch(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            model = request.query_params.get("model", "")
            if not model:
                raise BadRequest("query parameter 'model' is required", "model")
            if cache.epochs is None:
                raise Unavailable("the cache has no shared epoch (no Redis client)")
            return {"model": model, "epoch": await cache.epochs.bump(model)}

        return await guarded(request, op)

    async def flush(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            model = request.query_params.get("model") or None
            revision = request.query_params.get("model_revision") or None
            if revision is not None:
                tenant: str | None = request.query_params.get("tenant") or None
                deleted = await cache.entries.flush_revision(revision, tenant, model)
            else:
                tenant = tenant_param(request)
                deleted = await cache.entries.flush(tenant, model)
            return {"tenant": tenant, "model": model, "model_revision": revision, "deleted": deleted}

        return await guarded(request, op)

    def limit_param(request: Request) -> int:
        # Parsed before Redis sees it: `guarded` reports any other error as the cache being down (503).
        raw = request.query_params.get("limit") or str(INSPECT_DEFAULT_LIMIT)
        try:
            limit = int(raw)
        except ValueError:
            message = f"query parameter 'limit' must be an integer, got {raw[:40]!r}"
            raise BadRequest(message, "limit") from None
        if limit < 0:  # Redis refuses a negative LIMIT
            raise BadRequest(f"query parameter 'limit' must be >= 0, got {limit}", "limit")
        return min(limit, INSPECT_MAX_LIMIT)

    async def inspect(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            tenant, limit = tenant_param(request), limit_param(request)
            return {"entries": await cache.entries.inspect(tenant, limit)}

        return await guarded(request, op)

    # The handlers read their query parameters by hand; the document lists them all the same.
    app.add_api_route(
        "/admin/cache/stats", stats, methods=["GET"], tags=["admin"],
        openapi_extra=_query(("tenant", "only this tenant's count", False, _STR)),
    )
    app.add_api_route(
        "/admin/cache/flush", flush, methods=["POST"], tags=["admin"],
        openapi_extra=_query(
            ("tenant", "the tenant whose entries go (required unless model_revision is given)", False, _STR),
            ("model", "only this model's entries", False, _STR),
            ("model_revision", "only entries written under this model revision", False, _STR),
        ),
    )
    app.add_api_route(
        "/admin/cache/epoch", bump_epoch, methods=["POST"], tags=["admin"],
        openapi_extra=_query(
            ("model", "the model whose cache epoch goes up by one on every replica", True, _STR),
        ),
    )
    app.add_api_route(
        "/admin/cache/inspect", inspect, methods=["GET"], tags=["admin"],
        openapi_extra=_query(
            ("tenant", "the tenant whose newest entries are listed", True, _STR),
            ("limit", f"how many entries (at most {INSPECT_MAX_LIMIT})", False,
             {"type": "integer", "minimum": 0, "default": INSPECT_DEFAULT_LIMIT}),
        ),
    )


INSPECT_DEFAULT_LIMIT = 20
INSPECT_MAX_LIMIT = 1000
_STR: dict[str, Any] = {"type": "string"}


def _query(*params: tuple[str, str, bool, dict[str, Any]]) -> dict[str, Any]:
    """`openapi_extra` listing query parameters as (name, description, required, schema)."""
    return {
        "parameters": [
            {"name": name, "in": "query", "description": doc, "required": required, "schema": schema}
            for name, doc, required, schema in params
        ]
    }


def _epochs(cache: SemanticCache) -> dict[str, Any]:
    """The epochs this replica uses now: the setting, and per model the effective (shared) one."""
    shared = cache.epochs
    return {
        "setting": cache.settings.epoch,
        "models": shared.known() if shared is not None else {},
        "refresh_s": cache.settings.epoch_refresh_s,
    }


def _counters(cache: SemanticCache) -> dict[str, Any]:
    c = cache.counters
    return {
        "lookups": dict(c.lookups),
        "stores": c.stores,
        "redis_errors": c.redis_errors,
        "degraded": c.degraded,
        "singleflight_joined": c.singleflight_joined,
    }
