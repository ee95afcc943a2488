"""The one way either service is built and run from its settings: logging, the settings log line,
tracing, the routes both serve (OpenAI, generate) and CORS, the SemserveModelServer, and tracing's
flush at exit. A service brings only what is its own (`Service`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kserve
from fastapi import FastAPI
from grpc import aio

from semserve import logs, tracing
from semserve.config import ServerSettings
from semserve.openai_routes import OpenAIBackend, register_openai_routes, with_cors
from semserve.serving.metrics_filter import with_metrics_filter
from semserve.serving.server import SemserveModelServer
from semserve.v2.generate_routes import register_generate_routes
from semserve.v2.triton_routes import register_triton_routes

Asgi = Any  # an ASGI application


@dataclass
class Service:
    """What makes a server one service: its model (one per pod: Knative scales pods, not models),
    the backend of its OpenAI routes, and the routes and layers only it has."""

    model: kserve.Model
    openai: OpenAIBackend
    # Routes after the OpenAI and generate routes, e.g. the transformer's /admin.
    extra_routes: Callable[[FastAPI], None] | None = None
    # A layer inside CORS and the guard, e.g. the transformer's auth (CORS stays outside it: a
    # browser's preflight request carries no API key).
    inner_layer: Callable[[Asgi], Asgi] | None = None
    grpc_interceptors: tuple[aio.ServerInterceptor, ...] = ()
    # Models served beside `model` by the same process, e.g. the predictor's same-answer judge.
    extra_models: tuple[kserve.Model, ...] = ()


def _start_logging_and_tracing(
    name: str,
    settings: ServerSettings,
    trace_settings: tracing.TracingSettings | None = None,
    *,
    prompt_text_on_spans: bool = False,
) -> None:
    """Before anything else of the service runs, so its own start is logged and traced."""
    logs.configure(settings.log_level)
    log = logs.get_logger(f"semserve.{name}")
    log.info(f"{name}_settings", **{k: str(v) for k, v in settings.public_dict().items()})
    trace_settings = trace_settings or tracing.TracingSettings.from_env()
    if tracing.setup(trace_settings, name, prompt_text=prompt_text_on_spans):
        log.info("tracing", **trace_settings.public_dict())


def build_server(settings: ServerSettings, service: Service) -> SemserveModelServer:
    def setup(app: FastAPI) -> None:
        register_openai_routes(app, service.openai, prefix=settings.openai_route_prefix)
        register_generate_routes(app, service.model)
        register_triton_routes(app, [service.model, *service.extra_models])  # type: ignore[list-item]
        if service.extra_routes is not None:
            service.extra_routes(app)

    def wrap(app: Asgi) -> Asgi:
        app = with_metrics_filter(app)
        inner = service.inner_layer(app) if service.inner_layer is not None else app
        return with_cors(inner, settings.cors_origins)

    return SemserveModelServer.from_settings(
        settings, setup_app=setup, wrap_app=wrap, grpc_interceptors=service.grpc_interceptors
    )


def run_service(
    name: str,
    settings: ServerSettings,
    assemble: Callable[[], Service],
    trace_settings: tracing.TracingSettings | None = None,
    *,
    prompt_text_on_spans: bool = False,
) -> None:
    """Run service `name` ("predictor", "transformer") until SIGTERM. `assemble` builds its parts
    once logging and tracing are set up."""
    _start_logging_and_tracing(
        name, settings, trace_settings, prompt_text_on_spans=prompt_text_on_spans
    )
    service = assemble()
    try:
        build_server(settings, service).start([service.model, *service.extra_models])
    finally:
        tracing.shutdown()
    logs.get_logger(f"semserve.{name}").info(f"{name}_stopped")
