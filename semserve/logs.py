"""Structured logging: one JSON object per line, for our events and for every library logger.

`get_logger(name).info("event_name", key=value, ...)` writes
`{"ts": ..., "level": "info", "logger": name, "event": "event_name", "key": value}`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace

from semserve.errors import codes_of

# The request id of the request being served, so every line logged while serving it carries it.
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if fields is not None:
            entry["event"] = record.getMessage()
            entry.update(fields)
        else:
            entry["msg"] = record.getMessage()
        rid = request_id_var.get()
        if rid is not None and "request_id" not in entry:
            entry["request_id"] = rid
        # The trace of the request being served (a client's traceparent continues into it), so a
        # log line leads to its trace and back. Invalid (no tracing, no request): nothing added.
        sc = trace.get_current_span().get_span_context()
        if sc.is_valid:
            entry["trace_id"] = f"{sc.trace_id:032x}"
            entry["span_id"] = f"{sc.span_id:016x}"
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class EventLogger:
    """A thin wrapper that turns keyword arguments into JSON fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info=exc_info, **fields)


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


# KServe's exception handlers log every exception they answer at error level with a traceback,
# a 503 while the engine loads (a readiness probe a second) and a client's 404 alike. Those are
# expected: one line, at info for "not ready (yet)" and at warning for a client's error. The status
# is the error table's (semserve/errors.py, which matches KServe's classes by name, so this module
# needs no KServe import); anything else keeps KServe's error line.


class ExpectedErrorsFilter(logging.Filter):
    """Turns a library's error-with-traceback for an expected condition into one structured line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or record.levelno < logging.ERROR:
            return True
        status = codes_of(exc).http_status
        if status == 503:
            record.levelno, record.levelname, event = logging.INFO, "INFO", "request_not_ready"
        elif 400 <= status < 499:
            record.levelno, record.levelname, event = logging.WARNING, "WARNING", "request_rejected"
        else:
            return True
        if not logging.getLogger().isEnabledFor(record.levelno):
            return False
        record.msg, record.args = event, ()
        record.fields = {"status": status, "error": type(exc).__name__, "detail": str(exc)}  # type: ignore[attr-defined]
        record.exc_info, record.exc_text = None, None
        return True


def configure(level: str = "info") -> None:
    """Route every logger through one JSON handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries that install their own handlers would print a second, unstructured line.
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.error", "uvicorn.access", "vllm"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # uvicorn's access log duplicates our own request log line.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    kserve_logger = logging.getLogger("kserve")
    if not any(isinstance(f, ExpectedErrorsFilter) for f in kserve_logger.filters):
        kserve_logger.addFilter(ExpectedErrorsFilter())
