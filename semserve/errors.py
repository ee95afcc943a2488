"""Client-facing errors shared by every protocol, and the one table that says how each protocol
answers an error: its HTTP status, gRPC status code and OpenAI error type (`codes_of`), and the text
a client reads (`error_text`). REST, gRPC, the OpenAI routes, generate routes, the request log and
the log filter all read this table.

KServe's exceptions (which KServe raises while decoding a request, and which its own handlers answer
with the same statuses) are in the table by qualified class name, so this module imports no KServe.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass


class ServingError(Exception):
    """An error a client can act on; its status and codes are its row in the table below."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    @property
    def http_status(self) -> int:
        return codes_of(self).http_status

    @property
    def openai_type(self) -> str:
        return codes_of(self).openai_type


class BadRequest(ServingError, ValueError):
    """The request is wrong; `field` names what was wrong so the 400 can say it."""


class PayloadTooLarge(BadRequest):
    pass


class Unauthenticated(ServingError):
    """No valid credentials (an API key that is missing or unknown)."""


class Forbidden(ServingError):
    """Valid credentials that may not do this."""


class NotFound(ServingError):
    pass


class Unavailable(ServingError):
    """Not ready, draining for shutdown, or an upstream is down: retry elsewhere or later."""


class RateLimited(ServingError):
    """Over one of the tenant's limits (429, refused before any work): `limit` names it
    (requests_per_minute, tokens_per_minute, max_concurrent, fair_share), `retry_after_s` says when
    a retry can pass."""

    def __init__(self, message: str, limit: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.limit = limit
        self.retry_after_s = retry_after_s


class Overloaded(Unavailable):
    """The predictor is saturated for every tenant (503, refused before any work); retry after
    `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after(exc: BaseException) -> int | None:
    """The Retry-After header's value (whole seconds, at least 1) an error asks for, if any."""
    seconds = getattr(exc, "retry_after_s", None)
    if not isinstance(seconds, int | float):
        return None
    return max(1, math.ceil(seconds))


def error_headers(exc: BaseException) -> dict[str, str]:
    """The HTTP headers an error's answer carries: Retry-After for a refusal that names when."""
    seconds = retry_after(exc)
    return {} if seconds is None else {"retry-after": str(seconds)}


@dataclass(frozen=True)
class ErrorCodes:
    """How each protocol answers one kind of error."""

    http_status: int
    grpc_code: str  # the name of a grpc.StatusCode (kept a name: the table needs no grpc import)
    openai_type: str
    # The request log's outcome: the client left (499) rather than the request failing.
    cancelled: bool = False

    def grpc_status(self) -> object:
        """The grpc.StatusCode itself."""
        import grpc

        return getattr(grpc.StatusCode, self.grpc_code)


_INVALID = ErrorCodes(400, "INVALID_ARGUMENT", "invalid_request_error")
_NOT_FOUND = ErrorCodes(404, "NOT_FOUND", "not_found_error")
_UNAVAILABLE = ErrorCodes(503, "UNAVAILABLE", "service_unavailable")
_CANCELLED = ErrorCodes(499, "CANCELLED", "server_error", cancelled=True)
SERVER_ERROR = ErrorCodes(500, "INTERNAL", "server_error")

# The table: an error's row is that of the first class of its MRO listed here (most specific first).
ERROR_TABLE: dict[str, ErrorCodes] = {
    # Ours.
    f"{__name__}.PayloadTooLarge": ErrorCodes(413, "RESOURCE_EXHAUSTED", "invalid_request_error"),
    f"{__name__}.BadRequest": _INVALID,
    f"{__name__}.Unauthenticated": ErrorCodes(401, "UNAUTHENTICATED", "authentication_error"),
    f"{__name__}.Forbidden": ErrorCodes(403, "PERMISSION_DENIED", "permission_error"),
    f"{__name__}.NotFound": _NOT_FOUND,
    f"{__name__}.RateLimited": ErrorCodes(429, "RESOURCE_EXHAUSTED", "rate_limit_exceeded"),
    f"{__name__}.Unavailable": _UNAVAILABLE,
    f"{__name__}.ServingError": SERVER_ERROR,
    # KServe's. InferenceError is what its decoding raises for tensors a client sent wrongly
    # (e.g. non-UTF-8 bytes in a JSON BYTES tensor); our models never raise it.
    "kserve.errors.InvalidInput": _INVALID,
    "kserve.errors.InferenceError": _INVALID,
    "kserve.errors.UnsupportedProtocol": _INVALID,
    "fastapi.exceptions.RequestValidationError": _INVALID,
    "kserve.errors.ModelNotFound": _NOT_FOUND,
    "kserve.errors.ServerNotReady": _UNAVAILABLE,
    "kserve.errors.ServerNotLive": _UNAVAILABLE,
    "kserve.errors.ModelNotReady": _UNAVAILABLE,
    "kserve.errors.NoModelReady": _UNAVAILABLE,
    # The client went away (its task cancelled, its generator closed).
    "asyncio.exceptions.CancelledError": _CANCELLED,
    "builtins.GeneratorExit": _CANCELLED,
}


def codes_of(exc: BaseException) -> ErrorCodes:
    """The table's row for `exc`; an error it does not list is the server's fault (500)."""
    for cls in type(exc).__mro__:
        row = ERROR_TABLE.get(f"{cls.__module__}.{cls.__qualname__}")
        if row is not None:
            return row
    return SERVER_ERROR


# The errors a client of another semserve service (the transformer, calling the predictor) raises
# for the status or code it was answered with: the table read backwards, for the classes a client
# passes on as they are; anything else means the upstream is down or broken.
_CLIENT_SIDE = (BadRequest, NotFound)


def error_from_status(status: int, message: str, field: str | None = None) -> ServingError:
    """The error an upstream's HTTP-like `status` stands for (a 400 -> BadRequest, ...)."""
    for cls in _CLIENT_SIDE:
        if codes_of(cls(message)).http_status == status:
            return cls(message, field)
    return Unavailable(message, field)


def error_from_grpc_code(code_name: str, message: str, field: str | None = None) -> ServingError:
    """The error an upstream's gRPC status code (by name: "INVALID_ARGUMENT") stands for."""
    for cls in _CLIENT_SIDE:
        if codes_of(cls(message)).grpc_code == code_name:
            return cls(message, field)
    return Unavailable(message, field)


def error_field(exc: BaseException) -> str | None:
    """The request field an error names, when it names one."""
    field = getattr(exc, "field", None)
    return field if isinstance(field, str) and field else None


def error_text(exc: BaseException) -> str:
    """What a client (and the request log) reads of a failed request: our message, KServe's
    reason, else (a fault of ours) the exception's type and text."""
    if isinstance(exc, ServingError):
        return exc.message
    reason = getattr(exc, "reason", None) or getattr(exc, "error_msg", None)
    if reason:
        return str(reason)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def json_error_text(message: str, document: str | bytes, position: int) -> str:
    """A JSON syntax error as a client can find it: line, column and character, and the problem."""
    text = document.decode("utf-8", "replace") if isinstance(document, bytes) else str(document)
    error = json.JSONDecodeError(message, text, max(0, min(position, len(text))))
    return f"invalid JSON at line {error.lineno} column {error.colno} (char {error.pos}): {message}"
