"""Serving runtime both services share, one concept per module:

- state: the drain flag and in-flight count (ServingState), paths that are never work
- http_guard / grpc_guard: what every HTTP request and gRPC call goes through
- grpc_health: gRPC's standard health service, answered from readiness
- content_encoding: request bodies sent with gzip or deflate, decoded under the body limit
- spans: their server spans
- errors: HTTP error answers from the error table (semserve/errors.py)
- kserve_overrides: KServe's readiness and model repository, fixed for one model per pod
- server: SemserveModelServer (bind address, guards, graceful drain on SIGTERM)
- app_builder: the one way a service is built and run from its settings (Service, run_service)
"""

from semserve.serving.app_builder import Service, build_server, run_service
from semserve.serving.grpc_guard import CallInterceptor, GrpcGuard, StreamCall, UnaryCall
from semserve.serving.http_guard import HttpGuard
from semserve.serving.server import SemserveModelServer
from semserve.serving.state import EXEMPT_PATHS, ServingState

__all__ = [
    "EXEMPT_PATHS",
    "CallInterceptor",
    "GrpcGuard",
    "HttpGuard",
    "SemserveModelServer",
    "Service",
    "ServingState",
    "StreamCall",
    "UnaryCall",
    "build_server",
    "run_service",
]
