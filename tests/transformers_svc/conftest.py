"""The cache tests' Redis and cache fixtures, for the pipeline's tests over a real cache."""

from tests.cache.conftest import (  # noqa: F401  (fixtures)
    cache,
    cache_settings,
    clean_redis,
    redis_server,
    store,
)
