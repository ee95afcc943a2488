"""Admin HTTP routes over the cache (the same operations as `semserve cache ...`), protected by an
admin key when auth is on."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cache.policy import SemanticCache
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
            result = await cache.redis_store.stats(request.query_params.get("tenant") or None)
            return {**result, "counters": _counters(cache)}

        return await guarded(request, op)

    async def flush(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            model = request.query_params.get("model") or None
            revision = request.query_params.get("model_revision") or None
            if revision is not None:
                tenant: str | None = request.query_params.get("tenant") or None
                deleted = await cache.redis_store.flush_revision(revision, tenant, model)
            else:
                tenant = tenant_param(request)
                deleted = await cache.redis_store.flush(tenant, model)
            return {"tenant": tenant, "model": model, "model_revision": revision, "deleted": deleted}

        return await guarded(request, op)

    async def inspect(request: Request) -> JSONResponse:
        async def op() -> Any:
            assert cache is not None
            limit = int(request.query_params.get("limit", "20") or 20)
            return {"entries": await cache.redis_store.inspect(tenant_param(request), min(limit, 1000))}

        return await guarded(request, op)

    app.add_api_route("/admin/cache/stats", stats, methods=["GET"], tags=["admin"])
    app.add_api_route("/admin/cache/flush", flush, methods=["POST"], tags=["admin"])
    app.add_api_route("/admin/cache/inspect", inspect, methods=["GET"], tags=["admin"])


def _counters(cache: SemanticCache) -> dict[str, Any]:
    c = cache.counters
    return {
        "lookups": dict(c.lookups),
        "stores": c.stores,
        "redis_errors": c.redis_errors,
        "degraded": c.degraded,
        "singleflight_joined": c.singleflight_joined,
    }
