"""Who is asking and how, worked out once at the edge of the transformer (v2 REST/gRPC in model.py,
OpenAI in openai_backend.py) and carried by everything after it; and the record of how a request
ended, handed to the listener (the request log, transformers_svc/request_log.py).

Nothing after the edge re-derives tenant, request id or protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kserve import InferRequest
from pydantic import BaseModel

from semserve import openai_routes, tracing
from semserve.errors import codes_of, error_text
from semserve.sampling import SamplingOptions
from semserve.v2 import text_model
from transformers_svc.auth import tenant_var

Protocol = Literal["v2-rest", "v2-grpc", "openai"]


def cache_control(headers: dict[str, str]) -> frozenset[str]:
    """The request's Cache-Control directives (lowercased); `headers` has lowercase names."""
    raw = headers.get("cache-control", "")
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class RequestContext:
    tenant: str
    request_id: str
    protocol: Protocol
    route: str  # as the request log names it
    cache_control: frozenset[str]
    # The defaults until the body is parsed (`with_sampling`): a request that fails to parse has none.
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    started: float = field(default_factory=time.monotonic)

    def with_sampling(self, sampling: SamplingOptions) -> RequestContext:
        return replace(self, sampling=sampling)

    def choices(self, n: int) -> list[RequestContext]:
        """The contexts of the `n` choices of this request (OpenAI's n): seeded ones seed + index
        (SamplingOptions.for_choice), each its own cache entry. Unseeded sampled choices after the
        first read and write no cache: they are draws of their own, never the first one's answer
        (a policy that caches sampled answers would serve it to all, or single flight share it).
        Greedy ones are the same request, shared."""
        contexts = [self.with_sampling(self.sampling.for_choice(i)) for i in range(n)]
        if self.sampling.seed is None and self.sampling.temperature > 0:
            own_draw = self.cache_control | {"no-cache", "no-store"}
            contexts[1:] = [replace(c, cache_control=own_draw) for c in contexts[1:]]
        return contexts

    def seconds(self) -> float:
        return time.monotonic() - self.started


def _tenant(default: str) -> str:
    # Set by the auth middleware (transformers_svc/auth_middleware.py) from the caller's API key.
    return tenant_var.get() or default


def v2_context(
    payload: InferRequest, headers: dict[str, str] | None, *, model: str, default_tenant: str, route: str
) -> RequestContext:
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    protocol: Protocol = "v2-grpc" if payload.from_grpc else "v2-rest"
    tenant = _tenant(default_tenant)
    tracing.annotate(semserve__protocol=protocol, semserve__tenant=tenant, gen_ai__request__model=model)
    return RequestContext(
        tenant=tenant,
        request_id=text_model.request_id(payload, lowered),
        protocol=protocol,
        route=route,
        cache_control=cache_control(lowered),
    )


def openai_context(
    http: openai_routes.OpenAIHttpCall, *, model: str, default_tenant: str, route: str
) -> RequestContext:
    tenant = _tenant(default_tenant)
    tracing.annotate(semserve__protocol="openai", semserve__tenant=tenant, gen_ai__request__model=model)
    return RequestContext(
        tenant=tenant,
        request_id=http.request_id,
        protocol="openai",
        route=route,
        cache_control=cache_control(http.headers),
    )


@dataclass(frozen=True)
class RequestRecord:
    """How one request ended: what the request log writes (a stream: once it ends)."""

    context: RequestContext
    status: int  # HTTP-like: 200, 4xx, 499 (the client left), 5xx
    prompts: list[str]  # the text matched per prompt (a chat: its last user message)
    cache: list[str] = field(default_factory=list)  # one cache status per prompt
    answers: list[str] = field(default_factory=list)
    error: str | None = None
    # The request as received, for the full log: v2 REST parameters, or the OpenAI request body.
    parameters: dict[str, Any] | None = None
    body: BaseModel | None = None

    @classmethod
    def failed(cls, context: RequestContext, exc: BaseException, prompts: list[str]) -> RequestRecord:
        """A request whose handling raised `exc` before it had an answer."""
        return cls(context, status_of(exc), prompts, error=error_text(exc))


Listener = Callable[[RequestRecord], None]


def ignore(_: RequestRecord) -> None:
    """The listener when nothing records requests."""


def status_of(exc: BaseException) -> int:
    """The HTTP status a request ends with when its handling raised `exc` (the error table's)."""
    return codes_of(exc).http_status
