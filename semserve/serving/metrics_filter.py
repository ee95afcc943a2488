"""`GET /metrics?name[]=a&name[]=b`: only those series, the filter Prometheus's own exposition app
(prometheus_client's `make_asgi_app`, which vLLM's server uses) honours. KServe's /metrics handler
renders the whole registry whatever the query: ~56 kB on the predictor, 13-20 ms of its process
while it generates on this CPU, and the transformer's fair admission reads three of its gauges
several times a second (transformers_svc/saturation.py). Without `name[]` the request goes on to
KServe's handler unchanged."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

Asgi = Any  # an ASGI application


def with_metrics_filter(app: Asgi) -> Asgi:
    async def layer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics" and b"name" in scope["query_string"]:
            names = [v for k, v in parse_qsl(scope["query_string"].decode("latin-1")) if k == "name[]"]
            if names and scope["method"] in ("GET", "HEAD"):
                body = generate_latest(REGISTRY.restricted_registry(names))
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-type", CONTENT_TYPE_LATEST.encode()),
                    (b"content-length", str(len(body)).encode()),
                ]})
                await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
                return
        await app(scope, receive, send)

    return layer
