"""The Redis layout of the cache: index name, key names and the FT.CREATE field list, all versioned.

Every name carries `v{SCHEMA_VERSION}`: index `semserve:v2:{deployment}`, entries under
`semserve:v2:{deployment}:e:`. Bump SCHEMA_VERSION whenever the stored fields, the fingerprint
recipe (cache.keys) or the vector model change: the new code then reads only the new prefix and
index, so old entries are never served; they stop being written and die by their TTL (or drop
them with FT.DROPINDEX ... DD on the old index name).

Only the fields that are filtered or sorted on are indexed. The answer payload, the prompt text and
the display names live in the same hash but outside the schema: RediSearch can still RETURN them,
without tokenizing anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# 2: the KNN filters on one scope TAG (keys.scope_tag) instead of tenant + model + fingerprint TAGs.
SCHEMA_VERSION = 2
DEFAULT_DIM = 384  # all-MiniLM-L6-v2

# Hash field names, shared by the index definition and by store.py.
F_VECTOR = "vec"
F_TENANT = "tenant"  # TAG: keys.tag_value(tenant), hex only
F_MODEL = "model"  # TAG: keys.tag_value(model), hex only
F_SCOPE = "scope"  # TAG: keys.scope_tag(req), hex only; the KNN pre-filter
F_KIND = "kind"  # TAG: "chat" | "completion" | "v2"
F_CREATED_AT = "created_at"  # NUMERIC SORTABLE, unix seconds from the Redis clock
# Not indexed, only stored and returned:
F_ANSWER = "answer"  # the service's answer, JSON text, opaque to the cache
F_PROMPT = "prompt"  # the last user message as received, for the verifier and `cache inspect`
F_TENANT_NAME = "tenant_name"  # raw tenant id, for display only
F_MODEL_NAME = "model_name"  # raw model name (+ "@revision"), for display only

_DEPLOYMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True)
class IndexSchema:
    """Names and index definition for one deployment at one schema version."""

    deployment: str = "default"
    dim: int = DEFAULT_DIM
    version: int = SCHEMA_VERSION
    # HNSW parameters (when vector_algorithm is HNSW), chosen with `semserve bench scale`
    # (bench/RESULTS.md "Cache at scale"). M and EF_CONSTRUCTION fix the graph at FT.CREATE;
    # EF_RUNTIME is the default candidate list of a KNN query. EF_CONSTRUCTION 64 gave the same
    # recall@1 (1.000) and KNN latency as RediSearch's 200 in half the build time (20k entries in one
    # tenant: 14.1 s vs 27.7 s; a restarted Redis rebuilds the whole graph), and EF_RUNTIME above
    # the default 10 bought no recall.
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    hnsw_ef_runtime: int = 10
    # FLAT (exact brute force over the scope's entries) is the default: every KNN is pre-filtered to
    # one scope tag, and RediSearch then brute-forces that scope's entries with either index kind,
    # so HNSW's graph buys no speed here (20k entries in one tenant: KNN p50 2.56 ms FLAT vs 8.35 ms
    # HNSW) while it costs build time (100k: 2.4 s vs 104 s; a restarted Redis rebuilds it) and
    # memory. A scope holds at most max_entries_per_tenant entries. HNSW stays selectable (bench).
    vector_algorithm: str = "FLAT"

    def __post_init__(self) -> None:
        # Deployment names end up inside key names and the index name; ':' would let two
        # deployments' prefixes overlap, so only a plain charset is allowed.
        if not _DEPLOYMENT_RE.match(self.deployment):
            raise ValueError(
                f"deployment name {self.deployment!r} must match {_DEPLOYMENT_RE.pattern} "
                "(it becomes part of Redis key names)"
            )
        if self.dim <= 0 or self.version <= 0:
            raise ValueError("dim and version must be positive")
        if self.vector_algorithm not in ("HNSW", "FLAT"):
            raise ValueError(f"vector_algorithm must be HNSW or FLAT, got {self.vector_algorithm!r}")

    @property
    def base(self) -> str:
        return f"semserve:v{self.version}:{self.deployment}"

    @property
    def index_name(self) -> str:
        return self.base

    @property
    def entry_prefix(self) -> str:
        return f"{self.base}:e:"

    def entry_key(self, entry_id: str) -> str:
        return self.entry_prefix + entry_id

    def tenant_zset_key(self, tenant_tag: str) -> str:
        """Sorted set of a tenant's entry ids scored by creation time (µs), for the per-tenant cap."""
        return f"{self.base}:t:{tenant_tag}"

    @property
    def tenants_key(self) -> str:
        """Hash tenant tag -> raw tenant name, so stats can show names although tags are hashes."""
        return f"{self.base}:tenants"

    def fields(self) -> list[Any]:
        # Imported here so that importing the settings (and the CLI's --help) stays light.
        from redis.commands.search.field import NumericField, TagField, VectorField

        attrs: dict[str, Any] = {"TYPE": "FLOAT32", "DIM": self.dim, "DISTANCE_METRIC": "COSINE"}
        if self.vector_algorithm == "HNSW":
            attrs |= {"M": self.hnsw_m, "EF_CONSTRUCTION": self.hnsw_ef_construction,
                      "EF_RUNTIME": self.hnsw_ef_runtime}
        return [
            VectorField(F_VECTOR, self.vector_algorithm, attrs),
            TagField(F_TENANT),
            TagField(F_MODEL),
            TagField(F_SCOPE),
            TagField(F_KIND),
            NumericField(F_CREATED_AT, sortable=True),
        ]

    def definition(self) -> Any:
        from redis.commands.search.index_definition import IndexDefinition, IndexType

        return IndexDefinition(prefix=[self.entry_prefix], index_type=IndexType.HASH)
