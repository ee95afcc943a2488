"""SemserveModelServer: a kserve.ModelServer that binds a chosen address, puts our guards around
every HTTP and gRPC request, and shuts down gracefully on SIGTERM, since Knative scales pods down
while they serve.

SIGTERM: readiness turns false and new requests get 503 at once; requests in flight finish (up to
the grace period); then both servers stop, engines are shut down and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable, Generator
from concurrent import futures
from typing import Any, Self

import kserve
import uvicorn
from fastapi import FastAPI
from grpc import aio
from kserve.errors import NoModelReady
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.rest.server import RESTServer

from semserve import http_limits, kserve_rest, tracing
from semserve.config import ServerSettings
from semserve.logs import get_logger
from semserve.serving.errors import install_error_handlers
from semserve.serving.grpc_guard import GrpcGuard
from semserve.serving.grpc_health import add_health
from semserve.serving.http_guard import HttpGuard
from semserve.serving.kserve_overrides import ReadinessDataPlane, ServedModels
from semserve.serving.state import ServingState
from semserve.v2 import grpc_service
from semserve.v2.grpc_reflection import add_reflection
from semserve.v2.rest_infer import V2RestInfer

log = get_logger("semserve.serving")


class _QuietServer(uvicorn.Server):
    # Signals are ours: uvicorn's handler would stop accepting before readiness turned false.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class SemserveModelServer(kserve.ModelServer):
    """kserve.ModelServer with our bind address, guards and graceful drain."""

    def __init__(
        self,
        *,
        host: str,
        http_port: int,
        grpc_port: int,
        grace_period: float,
        max_body_bytes: int,
        max_header_bytes: int = http_limits.DEFAULT_MAX_HEADER_BYTES,
        setup_app: Callable[[FastAPI], None] | None = None,
        wrap_app: Callable[[Any], Any] | None = None,
        grpc_interceptors: tuple[aio.ServerInterceptor, ...] = (),
        v2_fast_path: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            http_port=http_port,
            grpc_port=grpc_port or 8081,
            enable_grpc=grpc_port > 0,
            grace_period=int(grace_period),
            enable_latency_logging=False,
            **kwargs,
        )
        self.state = ServingState()
        self.dataplane = ReadinessDataPlane(self.state, model_registry=self.registered_models)
        self.model_repository_extension = ServedModels(model_registry=self.registered_models)
        self.host = host
        self.grace = grace_period
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.setup_app = setup_app
        # An inner ASGI layer (e.g. the transformer's auth), run inside the guard.
        self.wrap_app = wrap_app
        self.grpc_interceptors = grpc_interceptors
        # v2 REST infer in semserve's own route (semserve/v2/rest_infer.py) instead of KServe's.
        self.v2_fast_path = v2_fast_path
        self._uvicorn: _QuietServer | None = None
        self._grpc: aio.Server | None = None
        self._stopped = asyncio.Event()
        self._models: list[kserve.Model] = []
        self._drain_task: asyncio.Future[None] | None = None

    @classmethod
    def from_settings(
        cls,
        settings: ServerSettings,
        *,
        setup_app: Callable[[FastAPI], None] | None = None,
        wrap_app: Callable[[Any], Any] | None = None,
        grpc_interceptors: tuple[aio.ServerInterceptor, ...] = (),
    ) -> Self:
        """The server both services run: its address, limits and grace period from `settings`,
        the routes and layers that make it one service or the other from the hooks."""
        return cls(
            host=settings.host,
            http_port=settings.http_port,
            grpc_port=settings.grpc_port,
            grace_period=settings.grace_period_s,
            max_body_bytes=settings.max_body_bytes,
            max_header_bytes=settings.max_header_bytes,
            setup_app=setup_app,
            wrap_app=wrap_app,
            grpc_interceptors=grpc_interceptors,
            v2_fast_path=settings.v2_fast_path,
        )

    def start(self, models: list[Any]) -> None:  # type: ignore[override]
        asyncio.run(self.serve(models))

    async def serve(self, models: list[Any]) -> None:
        self._models = models
        self._register(models)
        app = self._build_app()
        # What exists by now (modules, models, the app) lives until exit. Kept out of the garbage
        # collector's full passes, one takes a few ms instead of ~150 ms (a pause that some
        # request waits out; measured in the transformer).
        if gc.isenabled():
            gc.collect()
        # else a service turned collection off for its start (transformers_svc/cli.py): what the
        # start left unreachable (~2 300 objects, 0.5 MB in the transformer) is frozen with the
        # rest rather than found by a full pass (~0.15 s before ready); collection resumes now.
        gc.freeze()
        gc.enable()
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.http_port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=max(1, int(self.grace)),
            timeout_keep_alive=self.timeout_keep_alive,
            loop="asyncio",
            # httptools alone buffers request heads of any size; ours answers 431 past the limit.
            **http_limits.uvicorn_options(self.max_header_bytes),
        )
        self._uvicorn = _QuietServer(config)
        tasks = [asyncio.ensure_future(self._uvicorn.serve())]
        if self.enable_grpc:
            tasks.append(asyncio.ensure_future(self._serve_grpc()))
        tasks.extend(asyncio.ensure_future(s) for s in self.servers)  # engine start coroutines
        self.setup_event_loop()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        log.info(
            "server_starting",
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port if self.enable_grpc else None,
        )
        # Models that can fail for good after starting (an engine process dying) say so by
        # raising from `watch()`; they run until the servers end and never hold up a shutdown.
        watchers = [
            asyncio.ensure_future(self._watch(m)) for m in models if callable(getattr(m, "watch", None))
        ]
        everything = asyncio.gather(*tasks)
        try:
            # A server that dies on its own (port taken, engine failure) ends the process.
            done, _ = await asyncio.wait([everything, *watchers], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in (*tasks, everything, *watchers):
                task.cancel()
            self._stop_models()

    def _register(self, models: list[Any]) -> None:
        """What KServe's ModelServer does with its models at start, through its public API: the
        ready ones registered, each started (engine models' engines run as servers); none ready
        is NoModelReady."""
        ready = False
        for model in models:
            if model.ready:
                ready = True
                self.register_model(model)
                model.enable_latency_logging = self.enable_latency_logging
            model.start()
            if model.engine:
                self.servers.append(model.start_engine())
        if models and not ready:
            raise NoModelReady(models)

    async def _watch(self, model: Any) -> None:
        try:
            await model.watch()
        except Exception as exc:
            log.error("model_failed", model=getattr(model, "name", "?"), error=str(exc))
            # Readiness false and new requests refused at once; those in flight (failing fast
            # without the model) get their answers before the process ends.
            self.state.draining = True
            await self.state.wait_idle(min(self.grace, 5.0))
            raise

    def _build_app(self) -> Any:
        rest = RESTServer(
            "kserve.model_server:app",
            self.dataplane,
            self.model_repository_extension,
            self.http_port,
            grace_period=int(self.grace),
        )
        app: FastAPI = kserve.model_server.app
        if self.setup_app is not None:
            # Before KServe's routes, so ours win where a path is shared.
            self.setup_app(app)
        tracing.register_debug_routes(app)  # memory exporter only
        with kserve_rest.without_kserve_openai():  # KServe's OpenAI layer would import vLLM
            rest.create_application()
        install_error_handlers(app)
        # Innermost, so the guard, auth and CORS see its requests as they see KServe's.
        routed: Any = V2RestInfer(app, self.dataplane) if self.v2_fast_path else app
        inner: Any = self.wrap_app(routed) if self.wrap_app is not None else routed
        return HttpGuard(inner, self.state, self.max_body_bytes)

    async def _serve_grpc(self) -> None:
        server = aio.server(
            futures.ThreadPoolExecutor(max_workers=self.max_threads),
            interceptors=(
                GrpcGuard(self.state), *self.grpc_interceptors, ExceptionToStatusInterceptor()
            ),
            options=[
                ("grpc.max_send_message_length", self.max_body_bytes),
                ("grpc.max_receive_message_length", self.max_body_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        # KServe's servicer for health, metadata and repository RPCs; ours for ModelInfer (raw
        # outputs, as Triton) and ModelStreamInfer (which KServe's proto lacks).
        server.add_generic_rpc_handlers((
            grpc_service.generic_handler(
                self.dataplane, InferenceServicer(self.dataplane, self.model_repository_extension)
            ),
        ))
        add_health(server, self.dataplane.ready, (grpc_service.SERVICE,))
        add_reflection(server)
        address = f"{self.host}:{self.grpc_port}"
        if server.add_insecure_port(address) == 0:
            raise OSError(f"cannot bind gRPC to {address} (port in use?)")
        self._grpc = server
        await server.start()
        await server.wait_for_termination()

    def _on_signal(self, sig: int) -> None:
        if self.state.draining:
            return
        log.info("shutdown_signal", signal=signal.Signals(sig).name, in_flight=self.state.in_flight)
        self.state.draining = True
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        finished = await self.state.wait_idle(self.grace)
        log.info("drained", clean=finished, in_flight=self.state.in_flight)
        if self._grpc is not None:
            await self._grpc.stop(grace=1)
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def _stop_models(self) -> None:
        for model in self._models:
            with contextlib.suppress(Exception):
                model.stop()
