"""Serving runtime both services share, one concept per module:

- state: the drain flag and in-flight count (ServingState), paths that are never work
- http_guard / grpc_guard: what every HTTP request and gRPC call goes through
- fast_v2: v2 REST infer and ready answered before FastAPI/KServe's app (the same answers, leaner);
  v2_render: the bytes of a v2 REST answer as KServe's route writes them
- spans: their server spans
- errors: errors our models raise to KServe (Unavailable503, InvalidInput400) and HTTP error answers
- kserve_overrides: KServe's readiness and model repository, fixed for one model per pod
- server: SemserveModelServer (bind address, guards, graceful drain on SIGTERM)
- service: the one way a service is built and run from its settings (Service, run_service)
"""

from semserve.serving.errors import InvalidInput400, Unavailable503
from semserve.serving.grpc_guard import CallInterceptor, GrpcGuard, StreamCall, UnaryCall
from semserve.serving.http_guard import HttpGuard
from semserve.serving.server import SemserveModelServer
from semserve.serving.service import Service, build_server, run_service
from semserve.serving.state import EXEMPT_PATHS, ServingState

__all__ = [
    "EXEMPT_PATHS",
    "CallInterceptor",
    "GrpcGuard",
    "HttpGuard",
    "InvalidInput400",
    "SemserveModelServer",
    "Service",
    "ServingState",
    "StreamCall",
    "UnaryCall",
    "Unavailable503",
    "build_server",
    "run_service",
]
