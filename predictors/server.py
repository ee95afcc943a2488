"""Assemble and run the predictor: engine, KServe model, OpenAI routes, one ModelServer."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from predictors.config import PredictorSettings
from predictors.engine import Engine
from predictors.model import VLLMPredictor
from predictors.openai_backend import PredictorOpenAI
from semserve import logs, model_prep, tracing
from semserve.generate_routes import register_generate_routes
from semserve.openai_routes import register_openai_routes, with_cors
from semserve.serving import SemserveModelServer

log = logs.get_logger("semserve.predictor")


def resolve_model_dir(settings: PredictorSettings) -> Path:
    if settings.model is not None:
        path = settings.model.resolve()
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {path}: not an HF model directory (no config.json)")
        return path
    # The default model is prepared on first use so `semserve predictor` runs on a fresh clone.
    return model_prep.prepare().model_dir


def run(settings: PredictorSettings, trace_settings: tracing.TracingSettings | None = None) -> None:
    logs.configure(settings.log_level)
    log.info("predictor_settings", **{k: str(v) for k, v in settings.public_dict().items()})
    trace_settings = trace_settings or tracing.TracingSettings.from_env()
    if tracing.setup(trace_settings, "predictor"):
        log.info("tracing", **trace_settings.public_dict())
    model_dir = resolve_model_dir(settings)
    engine = Engine(settings, model_dir)
    model = VLLMPredictor(settings, engine)
    model.load()
    openai = PredictorOpenAI(settings, engine)

    def setup(app: FastAPI) -> None:
        register_openai_routes(app, openai, prefix=settings.openai_route_prefix)
        register_generate_routes(app, model)

    server = SemserveModelServer(
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        grace_period=settings.grace_period_s,
        max_body_bytes=settings.max_body_bytes,
        max_header_bytes=settings.max_header_bytes,
        setup_app=setup,
        wrap_app=lambda app: with_cors(app, settings.cors_origins),
    )
    try:
        server.start([model])
    finally:
        tracing.shutdown()
    log.info("predictor_stopped")
