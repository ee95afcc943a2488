"""Client-facing errors shared by every protocol; each service maps them to HTTP and gRPC codes."""

from __future__ import annotations


class ServingError(Exception):
    http_status = 500
    openai_type = "server_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class BadRequest(ServingError, ValueError):
    """The request is wrong; `field` names what was wrong so the 400 can say it."""

    http_status = 400
    openai_type = "invalid_request_error"


class PayloadTooLarge(BadRequest):
    http_status = 413


class NotFound(ServingError):
    http_status = 404
    openai_type = "not_found_error"


class Unavailable(ServingError):
    """Not ready, draining for shutdown, or an upstream is down: retry elsewhere or later."""

    http_status = 503
    openai_type = "service_unavailable"
