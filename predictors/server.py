"""Assemble and run the predictor: engine, KServe models (the main one and its same-answer judge),
OpenAI routes, one ModelServer."""

from __future__ import annotations

from pathlib import Path

from predictors.admin_routes import register_sleep_routes
from predictors.config import PredictorSettings
from predictors.engine import Engine
from predictors.judge import SameAnswerJudge
from predictors.model import VLLMPredictor
from predictors.openai_backend import PredictorOpenAI
from semserve import model_prep, tracing
from semserve.serving.app_builder import Service, run_service


def resolve_model_dir(settings: PredictorSettings) -> Path:
    if settings.model is not None:
        path = settings.model.resolve()
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {path}: not an HF model directory (no config.json)")
        return path
    # The default model is prepared on first use so `semserve predictor` runs on a fresh clone.
    return model_prep.prepare().model_dir


def assemble(settings: PredictorSettings) -> Service:
    engine = Engine(settings, resolve_model_dir(settings))
    model = VLLMPredictor(settings, engine)
    model.load()
    # The judge shares the engine: its requests join the main model's continuous batch.
    judge = SameAnswerJudge(settings.model_name, engine)
    judge.load()
    return Service(
        model=model,
        openai=PredictorOpenAI(settings, engine),
        extra_models=(judge,),
        extra_routes=lambda app: register_sleep_routes(app, engine),
    )


def run(settings: PredictorSettings, trace_settings: tracing.TracingSettings | None = None) -> None:
    run_service("predictor", settings, lambda: assemble(settings), trace_settings)
