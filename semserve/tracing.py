"""OpenTelemetry tracing both services share: settings, provider setup, W3C propagation helpers and
the in-memory exporter's debug route.

Off by default (`--trace-exporter none`): no provider is installed, the API's tracer stays the no-op
one, and every helper here returns at once because the current span is never recording. Spans are
only ever started as children of a recording span (the request span the serving guards start), so
unsampled requests cost a contextvar read per helper, nothing more.

Only the OpenTelemetry *API* is imported at module level, so cache/ may use these helpers without
pulling in the SDK; the SDK and exporters load in `setup()`.

Propagation is W3C Trace Context (`traceparent` / `tracestate`) on HTTP headers and gRPC metadata,
in both directions: the guards answer with a `traceresponse` header (Trace Context Level 2) naming
the server span, so a client can find the trace of its request.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from semserve.config import Settings, setting

__all__ = ["SpanKind", "TracingSettings"]  # re-exported: callers need no opentelemetry import

EXPORTERS = ("none", "otlp-grpc", "otlp-http", "memory")
DEBUG_SPANS_PATH = "/debug/spans"
# Finished spans the memory exporter keeps (oldest dropped): a test suite's worth, bounded memory.
MEMORY_MAX_SPANS = 20000

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = trace.get_tracer("semserve")


@dataclass
class TracingSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_TRACE_"

    exporter: str = setting(
        "none",
        "Where spans go: none (no SDK installed, zero cost), otlp-grpc, otlp-http, or memory (kept "
        "in process and served at GET /debug/spans, for tests).",
        choices=EXPORTERS,
    )
    endpoint: str = setting(
        "",
        "OTLP collector endpoint. Empty: the exporter's default (OTEL_EXPORTER_OTLP_* env, else "
        "localhost:4317 for gRPC, http://localhost:4318/v1/traces for HTTP).",
    )
    sample_ratio: float = setting(
        1.0,
        "Share of new traces recorded (0..1). Parent-based: a caller's sampled flag decides for the "
        "traces it starts.",
    )
    service_name: str = setting("", "service.name of the spans; empty: semserve-<service>.")


@dataclass
class _State:
    enabled: bool = False
    prompt_text: bool = False
    memory: Any = None  # InMemorySpanExporter in memory mode
    provider: Any = None
    service: str = ""


_state = _State()


def setup(settings: TracingSettings, service: str, *, prompt_text: bool = False) -> bool:
    """Install the SDK provider for `service` (predictor | transformer). Returns whether tracing is on.

    `prompt_text` is the transformer's --record-prompt-text: only then is prompt text (the matched
    and the cached prompt) put on the cache lookup span; otherwise never."""
    if settings.exporter == "none":
        return False
    if not 0.0 <= settings.sample_ratio <= 1.0:
        raise ValueError(f"SEMSERVE_TRACE_SAMPLE_RATIO: {settings.sample_ratio} is not within 0..1")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    name = settings.service_name or f"semserve-{service}"
    resource = Resource.create(
        {
            "service.name": name,
            "service.namespace": "semserve",
            # Pods of one revision share a name; the pod name (or pid) tells replicas apart.
            "service.instance.id": os.environ.get("POD_NAME") or f"{os.uname().nodename}-{os.getpid()}",
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
    )
    if settings.exporter == "memory":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        _state.memory = InMemorySpanExporter(max_spans=MEMORY_MAX_SPANS)
        # Synchronous: a span is readable at /debug/spans the moment it ends.
        provider.add_span_processor(SimpleSpanProcessor(_state.memory))
    elif settings.exporter == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExp

        kwargs: dict[str, Any] = {"endpoint": settings.endpoint} if settings.endpoint else {}
        provider.add_span_processor(BatchSpanProcessor(GrpcExp(**kwargs)))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExp

        endpoint = settings.endpoint
        if endpoint and not endpoint.rstrip("/").endswith("/v1/traces"):
            # The HTTP exporter takes the full traces URL; a collector's base URL is what people have.
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        exporter = HttpExp(**({"endpoint": endpoint} if endpoint else {}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state.enabled, _state.prompt_text, _state.provider, _state.service = (
        True, prompt_text, provider, service,
    )
    return True


def shutdown() -> None:
    """Flush batched spans (a pod drained by SIGTERM must not lose its last traces)."""
    if _state.provider is not None:
        with contextlib.suppress(Exception):
            _state.provider.shutdown()


def enabled() -> bool:
    return _state.enabled


def prompt_text_allowed() -> bool:
    return _state.prompt_text


def memory_mode() -> bool:
    return _state.memory is not None


# --- propagation ------------------------------------------------------------------------------


def extract(carrier: Mapping[str, str]) -> Context:
    """The caller's context from lower-cased HTTP headers or gRPC metadata."""
    return _PROPAGATOR.extract(carrier)


def inject(carrier: dict[str, str] | None = None, ctx: Context | None = None) -> dict[str, str]:
    """`traceparent`/`tracestate` of the current (or given) context added to `carrier`."""
    out = carrier if carrier is not None else {}
    if _state.enabled:
        _PROPAGATOR.inject(out, context=ctx)
    return out


def grpc_metadata(
    pairs: Iterable[tuple[str, str]], ctx: Context | None = None
) -> tuple[tuple[str, str], ...]:
    return (*pairs, *inject({}, ctx).items())


def traceresponse(span: Span) -> str | None:
    """W3C Trace Context Level 2 `traceresponse` value naming `span`, or None."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


# --- spans ------------------------------------------------------------------------------------


def recording() -> bool:
    return trace.get_current_span().is_recording()


def start_server_span(
    name: str, carrier: Mapping[str, str], attributes: dict[str, Any]
) -> tuple[Span, object] | None:
    """A SERVER span continuing the caller's trace, made current; None when tracing is off.
    End it with `end_server_span`."""
    if not _state.enabled:
        return None
    parent = extract(carrier)
    span = _TRACER.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    return span, token


def end_server_span(started: tuple[Span, object] | None, error: bool = False) -> None:
    if started is None:
        return
    span, token = started
    if error:
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    otel_context.detach(token)  # type: ignore[arg-type]


@contextlib.contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any) -> Iterator[Span]:
    """A child of the current span, current inside the block; the no-op span when the current one is
    not recording (tracing off, unsampled, or outside a request)."""
    if not trace.get_current_span().is_recording():
        yield trace.INVALID_SPAN
        return
    with _TRACER.start_as_current_span(name, kind=kind, attributes=clean_attributes(attributes)) as s:
        yield s


def start_child(
    name: str, kind: SpanKind = SpanKind.INTERNAL, parent: Context | None = None,
    start_ns: int | None = None, **attributes: Any,
) -> Span:
    """A child span that is NOT made current: for async generators, whose context is the caller's
    (attaching there would leak the span into the caller and detach in the wrong context)."""
    parent = parent if parent is not None else otel_context.get_current()
    if not trace.get_current_span(parent).is_recording():
        return trace.INVALID_SPAN
    return _TRACER.start_span(name, context=parent, kind=kind, attributes=clean_attributes(attributes),
                              start_time=start_ns)


def context_of(s: Span) -> Context:
    return trace.set_span_in_context(s)


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span, if it records."""
    s = trace.get_current_span()
    if s.is_recording():
        s.set_attributes(clean_attributes(attributes))


def fail(s: Span, exc: BaseException | str) -> None:
    if s.is_recording():
        if isinstance(exc, BaseException):
            s.record_exception(exc)
            s.set_attribute("error.type", type(exc).__name__)
        else:
            s.set_attribute("error.type", exc)
        s.set_status(Status(StatusCode.ERROR, str(exc)[:200]))


def clean_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    # OpenTelemetry drops None with a warning per call; leave them out instead. Keys use dots; Python
    # keyword arguments cannot, so `gen_ai__system` spells `gen_ai.system`.
    return {k.replace("__", "."): v for k, v in attributes.items() if v is not None}


def now_ns() -> int:
    return time.time_ns()


def monotonic_to_ns(ts: float, *, mono_now: float | None = None, wall_now_ns: int | None = None) -> int:
    """Wall-clock ns of a time.monotonic() timestamp (vLLM's engine core stamps its events with the
    machine's monotonic clock, which every process on the host shares)."""
    mono = time.monotonic() if mono_now is None else mono_now
    wall = time.time_ns() if wall_now_ns is None else wall_now_ns
    return wall - int((mono - ts) * 1e9)


# --- memory exporter: the debug route ---------------------------------------------------------


def finished_spans(trace_id: str | None = None) -> list[dict[str, Any]]:
    if _state.memory is None:
        return []
    out = []
    for s in _state.memory.get_finished_spans():
        sc = s.context
        tid = f"{sc.trace_id:032x}"
        if trace_id and tid != trace_id:
            continue
        out.append(
            {
                "name": s.name,
                "trace_id": tid,
                "span_id": f"{sc.span_id:016x}",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
                "kind": s.kind.name,
                "start_ns": s.start_time,
                "end_ns": s.end_time,
                "status": s.status.status_code.name,
                "attributes": dict(s.attributes or {}),
                "events": [
                    {"name": e.name, "ts_ns": e.timestamp, "attributes": dict(e.attributes or {})}
                    for e in s.events
                ],
                "service": s.resource.attributes.get("service.name"),
            }
        )
    return out


def register_debug_routes(app: Any) -> None:
    """GET/DELETE /debug/spans, only in memory mode (the route does not exist otherwise)."""
    if _state.memory is None:
        return
    from starlette.responses import JSONResponse

    # A plain Starlette route: FastAPI would resolve the handler's (postponed) annotations to
    # decide what to inject, and the request type is only imported here.
    async def spans(request: Any) -> JSONResponse:
        if request.method == "DELETE":
            _state.memory.clear()
            return JSONResponse({"cleared": True})
        return JSONResponse({"spans": finished_spans(request.query_params.get("trace_id") or None)})

    app.add_route(DEBUG_SPANS_PATH, spans, methods=["GET", "DELETE"], include_in_schema=False)
