"""Reading a raw FT.SEARCH reply (cache.entry_store sends the lookup's KNN as raw arguments): the rows of
a RESP3 map or of a RESP2 array, so the store works on either protocol."""

from __future__ import annotations

from typing import Any

DIST = "dist"  # the KNN's score alias in cache.entry_store's query


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogatepass") if isinstance(v, bytes) else str(v)


def search_rows(reply: Any) -> list[tuple[Any, dict[str, Any]]]:
    """(key, {field: raw value}) per document: a RESP3 map ({results: [{id, extra_attributes}]}) or
    a RESP2 array ([total, key, [field, value, ...], ...])."""
    if isinstance(reply, dict):
        results = reply.get(b"results", reply.get("results", []))
        rows = []
        for doc in results:
            attrs = doc.get(b"extra_attributes", doc.get("extra_attributes")) or {}
            rows.append((doc.get(b"id", doc.get("id")), {_text(f): v for f, v in attrs.items()}))
        return rows
    return [
        (reply[i], {_text(f): v for f, v in zip(reply[i + 1][::2], reply[i + 1][1::2], strict=True)})
        for i in range(1, len(reply) - 1, 2)
    ]
