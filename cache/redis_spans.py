"""Client spans for the cache's Redis round trips, with the DB semantic-convention attributes of
the store's Redis (OpenTelemetry API only, through semserve.tracing)."""

from __future__ import annotations

from typing import Any

from cache.entry_store import EntryStore
from semserve import tracing


class RedisSpans:
    """`spans("FT.SEARCH", index)`: the span of one Redis operation of `store`."""

    def __init__(self, store: EntryStore) -> None:
        self._attrs = redis_attributes(store)

    def __call__(self, operation: str, target: str | None = None) -> Any:
        name = f"{operation} {target}" if target else operation
        return tracing.span(name, tracing.SpanKind.CLIENT, db__operation__name=operation, **self._attrs)


def redis_attributes(store: EntryStore) -> dict[str, Any]:
    """DB semantic-convention attributes of the store's Redis (test doubles may have none)."""
    pool = getattr(getattr(store, "client", None), "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {})
    attrs: dict[str, Any] = {"db__system__name": "redis", "db__system": "redis"}
    if isinstance(kwargs, dict):
        if kwargs.get("host"):
            attrs["server__address"] = str(kwargs["host"])
        if kwargs.get("port"):
            attrs["server__port"] = int(kwargs["port"])
        if kwargs.get("db") is not None:
            attrs["db__namespace"] = str(kwargs["db"])
    return attrs
