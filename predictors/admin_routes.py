"""The sleep tier's admin routes on the predictor's HTTP port (predictors/sleep.py):

- `GET /admin/sleep`: the state (awake/asleep, idle seconds, wakes and the last wake's seconds);
  without the sleep tier, `sleep_mode: false` and why.
- `POST /admin/sleep`: sleep now (409 while generations run).
- `POST /admin/wake`: wake now (e.g. a gateway that sees a user arrive, before the first request).

Without the sleep tier (on CPU always: vLLM's CPU backend has no sleep mode) the POST routes answer
409 naming why; while the engine starts, 503.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from predictors.engine import Engine
from predictors.sleep import Busy
from semserve import sleep_mode


def why_off(engine: Engine) -> str:
    """Why this predictor has no sleep tier."""
    if engine.on_gpu is False:
        return f"no sleep mode on this predictor: {sleep_mode.CPU_NO_SLEEP}"
    return (
        "no sleep mode on this predictor: it was started with --sleep-after-idle-s 0 (vLLM builds "
        "sleep mode into the engine at start)"
    )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


def register_sleep_routes(app: FastAPI, engine: Engine) -> None:
    def starting() -> bool:
        # Configured and not built yet, or not yet known whether this is a GPU.
        return engine.on_gpu is None or (engine.sleep is None and engine.settings.sleep_enabled)

    def unavailable() -> JSONResponse | None:
        if engine.sleep is not None:
            return None
        if starting():
            return _error(503, "the engine is not ready yet")
        return _error(409, why_off(engine))

    async def state() -> Any:
        if engine.sleep is None:
            if starting():
                return _error(503, "the engine is not ready yet")
            return {"sleep_mode": False, "state": "awake", "why": why_off(engine)}
        return engine.sleep.state().to_dict()

    async def sleep() -> Any:
        if (answer := unavailable()) is not None:
            return answer
        assert engine.sleep is not None
        try:
            changed = await engine.sleep.sleep("admin")
        except Busy as exc:
            return _error(409, str(exc))
        return {**engine.sleep.state().to_dict(), "changed": changed}

    async def wake() -> Any:
        if (answer := unavailable()) is not None:
            return answer
        assert engine.sleep is not None
        changed = await engine.sleep.wake("admin")
        return {**engine.sleep.state().to_dict(), "changed": changed}

    app.add_api_route("/admin/sleep", state, methods=["GET"])
    app.add_api_route("/admin/sleep", sleep, methods=["POST"])
    app.add_api_route("/admin/wake", wake, methods=["POST"])
