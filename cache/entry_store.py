"""Storage of cache entries in Redis + RediSearch: one hash per entry, one HNSW index per deployment.

Entry id = `keys.exact_key(req)`: the exact lookup is one HMGET on the entry itself (no pointer key
to keep in step with it), and two replicas storing the same request overwrite one entry instead of
adding two.

Lifetime: a fixed TTL set when the entry is written; reads never touch it. Per-tenant cap: a sorted
set of the tenant's ids scored by creation time (Redis clock, µs), trimmed in the same Lua script
that writes the entry, so the cap holds under concurrent writers. The script names evicted keys it
derives itself, which is fine on a standalone Redis (not cluster-safe).

Index creation and the admin queries go through redis-py's search API (`client.ft(index)`, `Query`,
`querystring`): the library builds the FT.* arguments and parses the replies into Result/Document
objects. The lookup's KNN (`search`) is sent as raw FT.SEARCH arguments and its reply read here: it
is the one query on the hit path. The tag values in the filters are hex digests (cache.keys), so
nothing needs escaping.

This module does no timeouts or fail-open itself beyond the socket timeout: that is cache.semantic_cache's
job. Errors surface as redis-py exceptions.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.commands.search.document import Document
from redis.commands.search.query import Query
from redis.commands.search.querystring import intersect, tags
from redis.exceptions import ResponseError

from cache import keys
from cache.keys import CacheRequest
from cache.payload import Payload, dumps, loads
from cache.redis_client import make_client
from cache.schema import (
    F_ANSWER,
    F_CREATED_AT,
    F_KIND,
    F_MODEL,
    F_MODEL_NAME,
    F_PROMPT,
    F_SCOPE,
    F_TENANT,
    F_TENANT_NAME,
    F_VECTOR,
    SCHEMA_VERSION,
    IndexSchema,
)
from cache.search_reply import DIST, search_rows
from cache.settings import CacheSettings
from semserve.logs import get_logger

log = get_logger("cache.entry_store")

# KEYS: entry hash, tenant zset, tenants hash.
# ARGV: ttl_ms, cap, entry prefix, entry id, tenant tag, tenant name, field/value pairs...
# Returns {created_at as "%.6f" seconds, number of evicted entries}.
_PUT_LUA = """
local ttl_ms = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- Strictly increasing scores, so "oldest" is well defined even for writes in the same microsecond.
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] ~= nil and tonumber(last[2]) >= now then now = tonumber(last[2]) + 1 end
local created = string.format('%.6f', now / 1000000)
-- DEL first: an overwrite must not keep fields of the previous version.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'created_at', created, unpack(ARGV, 7))
redis.call('PEXPIRE', KEYS[1], ttl_ms)
-- Ids whose entries have expired by now would count against the cap.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%.0f', now - ttl_ms * 1000))
redis.call('ZADD', KEYS[2], string.format('%.0f', now), ARGV[4])
local evicted = 0
local over = redis.call('ZCARD', KEYS[2]) - cap
if over > 0 then
  local old = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  for _, id in ipairs(old) do evicted = evicted + redis.call('DEL', ARGV[3] .. id) end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
-- The zset lives as long as its youngest entry.
if redis.call('PTTL', KEYS[2]) < ttl_ms then redis.call('PEXPIRE', KEYS[2], ttl_ms) end
redis.call('HSET', KEYS[3], ARGV[5], ARGV[6])
return {created, evicted}
"""


@dataclass(frozen=True)
class CachedAnswer:
    answer: Payload  # the service's payload, returned as stored (cache/payload.py)
    entry_id: str
    created_at: float  # unix seconds (Redis clock)
    similarity: float = 1.0  # 1.0 for exact hits
    prompt: str = ""  # the stored prompt (for a semantic hit: the paraphrase that was cached)


@dataclass(frozen=True)
class Candidate:
    """A KNN neighbour: what the verifier judges (prompt, similarity) and what a hit serves."""

    entry_id: str
    prompt: str
    similarity: float  # cosine similarity, 1 - RediSearch's cosine distance
    answer: Payload


class SchemaMismatchError(RuntimeError):
    """The index exists with a different layout; bump SCHEMA_VERSION instead of reusing the name."""


def is_missing_index(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, ResponseError) and ("no such index" in msg or "unknown index" in msg)


def _s(v: Any) -> str:
    return v.decode("utf-8", "surrogatepass") if isinstance(v, bytes) else str(v)


def _b(v: str) -> bytes:
    # surrogatepass: a lone surrogate (valid in a Python str decoded from JSON) must round-trip,
    # not make the write fail.
    return v.encode("utf-8", "surrogatepass")


def _field(doc: Document, name: str, default: bytes = b"") -> Any:
    """A returned field of a search result (absent when the hash lost it, e.g. expired)."""
    return getattr(doc, name, default)


def _returning(query: Query, *fields: str) -> Query:
    """Return these hash fields as raw bytes: prompts may hold lone surrogates (stored with
    surrogatepass, see _b), which the library's lenient decoding would replace."""
    for name in fields:
        query.return_field(name, decode_field=False)
    return query


def _scope_filter(tenant_tag: str | None = None, model: str | None = None) -> str:
    """The entries of one tenant and/or one model (all revisions); "*" for every entry."""
    terms = {}
    if tenant_tag is not None:
        terms[F_TENANT] = tags(tenant_tag)
    if model is not None:
        terms[F_MODEL] = tags(keys.model_tag(model))
    return str(intersect(**terms)) if terms else "*"


class EntryStore:
    def __init__(
        self,
        client: aioredis.Redis,
        schema: IndexSchema,
        *,
        max_entries_per_tenant: int = 10000,
        ttl_seconds: int = 86400,
    ) -> None:
        if max_entries_per_tenant < 1 or ttl_seconds < 1:
            raise ValueError("max_entries_per_tenant and ttl_seconds must be >= 1")
        self.client = client
        self.schema = schema
        self.max_entries_per_tenant = max_entries_per_tenant
        self.ttl_seconds = ttl_seconds
        self._put_script = client.register_script(_PUT_LUA)

    @classmethod
    def from_settings(
        cls,
        settings: CacheSettings,
        *,
        schema_version: int = SCHEMA_VERSION,
        client: aioredis.Redis | None = None,
    ) -> EntryStore:
        schema = IndexSchema(settings.deployment, settings.embedding_dim, schema_version)
        return cls(
            client if client is not None else make_client(settings),
            schema,
            max_entries_per_tenant=settings.max_entries_per_tenant,
            ttl_seconds=settings.ttl_seconds,
        )

    async def close(self) -> None:
        await self.client.aclose()

    # -- index -------------------------------------------------------------------------------------

    async def ensure_index(self) -> bool:
        """Create the index if it is missing (first start, or Redis came back empty). Idempotent.

        Returns True if this call created it. Raises SchemaMismatchError if an index of this name
        exists with another vector dimension.
        """
        name = self.schema.index_name
        try:
            info = await self.client.ft(name).info()
        except ResponseError as e:
            if not is_missing_index(e):
                raise
        else:
            self._check_dim(info)
            return False
        try:
            await self.client.ft(name).create_index(self.schema.fields(), definition=self.schema.definition())
        except ResponseError as e:
            if "already exists" in str(e).lower():  # another replica won the race
                return False
            raise
        log.info("cache_index_created", index=name, dim=self.schema.dim, version=self.schema.version)
        return True

    def _check_dim(self, info: dict[str, Any]) -> None:
        for a in info.get("attributes", []):
            if a.get("identifier") == F_VECTOR and "dim" in a:
                if int(a["dim"]) != self.schema.dim:
                    raise SchemaMismatchError(
                        f"index {self.schema.index_name} has dim {a['dim']}, expected {self.schema.dim}; "
                        "bump cache.schema.SCHEMA_VERSION when the embedder changes"
                    )

    # -- reads -------------------------------------------------------------------------------------

    def _entry_id(self, req: CacheRequest) -> str:
        return keys.exact_key(req, self.schema.version)

    async def get_exact(self, req: CacheRequest) -> CachedAnswer | None:
        """One HMGET of the entry keyed by the exact key; the vector is not transferred."""
        entry_id = self._entry_id(req)
        answer, created, prompt = await self.client.hmget(
            self.schema.entry_key(entry_id), [F_ANSWER, F_CREATED_AT, F_PROMPT]
        )
        if answer is None:
            return None
        return CachedAnswer(
            answer=loads(_s(answer)),
            entry_id=entry_id,
            created_at=float(created or 0.0),
            similarity=1.0,
            prompt=_s(prompt or b""),
        )

    def _filter(self, req: CacheRequest) -> str:
        # One selective tag: intersecting tags that match the whole deployment (model, fingerprint)
        # cost more than the vector work at 1M entries (bench/RESULTS.md "Cache at scale"). A hex
        # digest: nothing in it needs escaping in a TAG query, so it is written directly (the
        # querystring objects cost ~20 us on every lookup).
        return f"@{F_SCOPE}:{{{keys.scope_tag(req, self.schema.version)}}}"

    def _vector_bytes(self, vector: np.ndarray) -> bytes:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        if v.shape[0] != self.schema.dim:
            raise ValueError(f"vector has {v.shape[0]} dims, the index has {self.schema.dim}")
        return v.tobytes()

    async def search(self, req: CacheRequest, vector: np.ndarray, k: int = 5) -> list[Candidate]:
        """The k nearest entries of the same scope (tenant + fingerprint), most similar first.

        Returns only what the decision uses: the prompt and distance for the verifier, the answer
        to serve an accepted candidate without a second round trip. The one query of a lookup's hot
        path, so it is sent as raw FT.SEARCH arguments and its reply read directly: building a
        Query and parsing into Result/Document objects cost ~0.1 of ~0.7 ms per KNN (A/B, issue 14)."""
        k = int(k)
        query = f"{self._filter(req)}=>[KNN {k} @{F_VECTOR} $vec AS {DIST}]"
        reply = await self.client.execute_command(
            "FT.SEARCH", self.schema.index_name, query,
            "PARAMS", 2, "vec", self._vector_bytes(vector),
            "RETURN", 3, F_PROMPT, F_ANSWER, DIST,
            "SORTBY", DIST, "ASC", "LIMIT", 0, k, "DIALECT", 2,
        )  # fmt: skip
        prefix = self.schema.entry_prefix
        out = []
        for key, fields in search_rows(reply):
            answer = fields.get(F_ANSWER, b"")
            if not answer:  # expired between match and load
                continue
            out.append(
                Candidate(
                    entry_id=_s(key).removeprefix(prefix),
                    prompt=_s(fields.get(F_PROMPT, b"")),
                    similarity=1.0 - float(fields[DIST]),
                    answer=loads(_s(answer)),
                )
            )
        out.sort(key=lambda c: c.similarity, reverse=True)
        return out

    # -- writes ------------------------------------------------------------------------------------

    async def put(
        self,
        req: CacheRequest,
        prompt: str,
        vector: np.ndarray,
        answer: Payload,
        ttl_seconds: int | None = None,
    ) -> str:
        """Write (or overwrite) the entry for `req`; returns its id. Evicts the tenant's oldest
        entries beyond the cap in the same script."""
        ttl = int(ttl_seconds if ttl_seconds is not None else self.ttl_seconds)
        if ttl < 1:
            raise ValueError("ttl_seconds must be >= 1")
        entry_id = self._entry_id(req)
        t_tag = keys.tenant_tag(req.tenant)
        fields: list[Any] = [
            F_VECTOR, self._vector_bytes(vector),
            F_TENANT, t_tag,
            F_MODEL, keys.model_tag(req.model),
            F_SCOPE, keys.scope_tag(req, self.schema.version),
            F_KIND, req.kind,
            F_ANSWER, _b(dumps(answer)),
            F_PROMPT, _b(prompt),
            F_TENANT_NAME, _b(req.tenant),
            F_MODEL_NAME, _b(req.model_label),
        ]  # fmt: skip
        _, evicted = await self._put_script(
            keys=[
                self.schema.entry_key(entry_id),
                self.schema.tenant_zset_key(t_tag),
                self.schema.tenants_key,
            ],
            args=[
                ttl * 1000,
                self.max_entries_per_tenant,
                self.schema.entry_prefix,
                entry_id,
                t_tag,
                _b(req.tenant),
                *fields,
            ],
        )
        if int(evicted):
            log.debug("cache_evicted", tenant_tag=t_tag[:12], count=int(evicted))
        return entry_id

    async def _ids_matching(self, query: str, batch: int) -> list[str]:
        q = Query(query).no_content().paging(0, batch).dialect(2)
        res = await self.client.ft(self.schema.index_name).search(q)
        prefix = self.schema.entry_prefix
        return [d.id[len(prefix) :] for d in res.docs if d.id.startswith(prefix)]

    async def flush_revision(
        self, revision: str, tenant: str | None = None, model: str | None = None, *, batch: int = 1000
    ) -> int:
        """Delete the entries written under model revision `revision` (of one tenant and/or model if
        given, else of every tenant of this deployment). Returns the count.

        The revision is inside the fingerprint (a digest), not an indexed field; the display label
        `model@revision` stored beside it tells them apart, so the matching entries are found by
        reading that label back, page by page, before deleting anything."""
        if not revision:
            raise ValueError("revision must be non-empty")
        query = _scope_filter(keys.tenant_tag(tenant) if tenant is not None else None, model)
        suffix = f"@{revision}"
        found: list[tuple[str, str]] = []  # (entry id, tenant tag)
        offset = 0
        prefix = self.schema.entry_prefix
        try:
            while True:
                q = _returning(Query(query), F_MODEL_NAME, F_TENANT).paging(offset, batch).dialect(2)
                docs = (await self.client.ft(self.schema.index_name).search(q)).docs
                for doc in docs:
                    label = _s(_field(doc, F_MODEL_NAME))
                    if doc.id.startswith(prefix) and label.endswith(suffix):
                        found.append((doc.id[len(prefix) :], _s(_field(doc, F_TENANT))))
                if len(docs) < batch:
                    break
                offset += batch
        except ResponseError as e:
            if not is_missing_index(e):
                raise
        deleted = 0
        for start in range(0, len(found), batch):
            chunk = found[start : start + batch]
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(*[self.schema.entry_key(i) for i, _ in chunk])
            for i, t_tag in chunk:
                pipe.zrem(self.schema.tenant_zset_key(t_tag), i)
            deleted += int((await pipe.execute())[0])
        log.info("cache_flushed", tenant=tenant, model=model, revision=revision, deleted=deleted)
        return deleted

    async def flush(self, tenant: str, model: str | None = None, *, batch: int = 1000) -> int:
        """Delete a tenant's entries (only those of `model`, all revisions, if given). Returns the count."""
        t_tag = keys.tenant_tag(tenant)
        zkey = self.schema.tenant_zset_key(t_tag)
        query = _scope_filter(t_tag, model)
        deleted = 0
        try:
            while True:
                ids = await self._ids_matching(query, batch)
                if not ids:
                    break
                pipe = self.client.pipeline(transaction=False)
                pipe.delete(*[self.schema.entry_key(i) for i in ids])
                pipe.zrem(zkey, *ids)
                n, _ = await pipe.execute()
                deleted += int(n)
                if int(n) == 0:  # the index still lists keys that are already gone
                    break
        except ResponseError as e:
            if not is_missing_index(e):
                raise
        if model is None:
            # The zset also knows entries the index may not (index missing or still rebuilding).
            ids = [_s(i) for i in await self.client.zrange(zkey, 0, -1)]
            if ids:
                deleted += int(await self.client.delete(*[self.schema.entry_key(i) for i in ids]))
            await self.client.delete(zkey)
            await self.client.hdel(self.schema.tenants_key, t_tag)
        log.info("cache_flushed", tenant=tenant, model=model, deleted=deleted)
        return deleted

    # -- introspection -----------------------------------------------------------------------------

    async def _count(self, query: str) -> int:
        res = await self.client.ft(self.schema.index_name).search(Query(query).paging(0, 0).dialect(2))
        return int(res.total)

    async def stats(self, tenant: str | None = None) -> dict[str, Any]:
        """Entries per tenant and index figures. Counts come from the index, so they exclude expired
        entries once Redis has reaped them."""
        out: dict[str, Any] = {"index": self.schema.index_name, "schema_version": self.schema.version}
        try:
            info = await self.client.ft(self.schema.index_name).info()
        except ResponseError as e:
            if not is_missing_index(e):
                raise
            out["index_exists"] = False
            out["tenants"] = {}
            return out
        out["index_exists"] = True
        out["num_docs"] = int(info.get("num_docs", 0))
        for k in ("vector_index_sz_mb", "total_index_memory_sz_mb", "inverted_sz_mb"):
            if k in info:
                out[k] = float(_s(info[k]))
        out["percent_indexed"] = float(_s(info.get("percent_indexed", 1)))
        mem = await self.client.info("memory")
        out["redis_used_memory_bytes"] = int(mem.get("used_memory", 0))
        if tenant is not None:
            names = {keys.tenant_tag(tenant): tenant}
        else:
            names = {_s(k): _s(v) for k, v in (await self.client.hgetall(self.schema.tenants_key)).items()}
        tenants = {}
        for tag, name in sorted(names.items(), key=lambda kv: kv[1]):
            n = await self._count(_scope_filter(tag))
            if n or tenant is not None:
                tenants[name] = n
        out["tenants"] = tenants
        return out

    async def inspect(self, tenant: str, limit: int = 20) -> list[dict[str, Any]]:
        """A tenant's newest entries, for debugging."""
        query = _returning(
            Query(_scope_filter(keys.tenant_tag(tenant))), F_PROMPT, F_MODEL_NAME, F_KIND, F_ANSWER
        ).return_field(F_CREATED_AT)
        query = query.sort_by(F_CREATED_AT, asc=False).paging(0, int(limit)).dialect(2)
        try:
            docs = (await self.client.ft(self.schema.index_name).search(query)).docs
        except ResponseError as e:
            if is_missing_index(e):
                return []
            raise
        pipe = self.client.pipeline(transaction=False)
        for doc in docs:
            pipe.pttl(doc.id)
        ttls = await pipe.execute() if docs else []
        prefix = self.schema.entry_prefix
        now = time.time()
        out = []
        for doc, ttl in zip(docs, ttls, strict=True):
            answer = _field(doc, F_ANSWER, b"")
            if not answer:
                continue
            created = float(_field(doc, F_CREATED_AT, "0"))
            out.append(
                {
                    "id": doc.id[len(prefix) :],
                    "model": _s(_field(doc, F_MODEL_NAME)),
                    "kind": _s(_field(doc, F_KIND)),
                    "prompt": _s(_field(doc, F_PROMPT)),
                    "created_at": created,
                    "age_s": round(max(0.0, now - created), 3),
                    "expires_in_s": round(int(ttl) / 1000.0, 3) if int(ttl) >= 0 else None,
                    "answer": json.loads(_s(answer)),
                }
            )
        return out
