"""The asyncio Redis client of the cache: timeouts, retry, protocol and TLS from CacheSettings."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cache.settings import CacheSettings


def make_client(settings: CacheSettings) -> aioredis.Redis:
    """An asyncio client whose every call is bounded by the store timeout.

    One immediate retry (no backoff) covers the stale pooled connection after a Redis restart; the
    library default (3 retries, exponential backoff) would stall requests for seconds. RESP3 with
    `legacy_responses=False`: the search API parses FT.SEARCH into Result objects and FT.INFO into a
    dict with typed values (the legacy RESP3 surface returns raw maps for both).
    """
    timeout = settings.store_timeout_ms / 1000.0
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 1),
        "protocol": 3,
        "legacy_responses": False,
        "decode_responses": False,  # vectors are binary
        "health_check_interval": 0,
    }
    if settings.redis_password:
        kwargs["password"] = settings.redis_password
    if settings.ca_file is not None:
        # redis:// connections would reject the TLS arguments only at the first command, as a
        # TypeError far from the cause: refuse the combination at startup instead.
        if not settings.redis_url.startswith("rediss://"):
            raise ValueError("cache ca_file is set but the Redis URL is not rediss:// (TLS)")
        kwargs["ssl_ca_certs"] = str(settings.ca_file)
        kwargs["ssl_cert_reqs"] = "required"
    return aioredis.Redis.from_url(settings.redis_url, **kwargs)
