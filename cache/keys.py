"""What identifies a cacheable request, as pure functions.

A request splits into two parts:
- the last user message, the only part matched semantically (by embedding + verifier);
- everything else that changes the answer (model, revision, kind, system prompt, earlier turns,
  tools, response_format, sampling params): the `fingerprint`. Only entries with an identical
  fingerprint are ever compared, so a paraphrase can be served only for the same context.

`exact_key` hashes tenant + fingerprint + the normalized last message: an exact repeat is one
lookup, no embedding.

Tenant, model and scope reach Redis only as sha256 hex digests (`tag_value`, `scope_tag`): [0-9a-f]
needs no escaping in a TAG query, so no tenant string can inject query syntax or match another
tenant's tag, and distinct strings collide only if sha256 does.

`scope_tag` is the one TAG a KNN filters on: tenant + fingerprint (so model, revision, kind,
context, sampling, epoch and schema version). One selective tag lets RediSearch pre-filter to the
scope's own entries; the earlier three-tag filter intersected the model and fingerprint tags, which
list every entry of a deployment, and cost more than the vector work at 1M entries.

Stream vs non-stream is deliberately not part of the key: the services store one format-neutral
answer and render it either way. A service whose stored answer depends on it must put it in
`context`.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from cache.schema import SCHEMA_VERSION
from semserve.sampling import ADJUSTMENT_DEFAULTS, SamplingOptions

Kind = Literal["chat", "completion", "v2"]
KINDS: tuple[str, ...] = ("chat", "completion", "v2")

# Characters NFKC keeps but that render as nothing; they would make identical-looking prompts differ.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))


# Options that leave the answer as it is: what is reported beside it (logprobs, the answer's or
# its prompt's, whose requests are never cached) and how it is delivered (a stream's chunk size).
NOT_KEYED = ("logprobs", "prompt_logprobs", "stream_interval")


def _at_default(name: str, value: Any) -> bool:
    if name in NOT_KEYED:
        return True
    if isinstance(value, list):  # token ids, from JSON
        value = tuple(value)
    return name in ADJUSTMENT_DEFAULTS and value == ADJUSTMENT_DEFAULTS[name]


@dataclass(frozen=True)
class SamplingKey:
    """The sampling parameters that change the answer. None means "the server default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = None  # OpenAI allows one string or a list
    seed: int | None = None
    ignore_eos: bool = False
    # Any other option that changes the answer (e.g. repetition_penalty); JSON-able values.
    extra: Mapping[str, Any] | None = None

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> SamplingKey:
        """From a dict such as semserve.sampling.SamplingOptions.to_dict(). Pass the resolved
        options (defaults filled in), so an omitted field and its explicit default key alike.
        Keys not named here go to `extra`, so they still count."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        # An adjustment at its default changes nothing: it keys as if absent (as in from_options).
        extra = {k: v for k, v in options.items() if k not in known and not _at_default(k, v)}
        kw = {k: v for k, v in options.items() if k in known}
        if isinstance(kw.get("stop"), list):
            kw["stop"] = tuple(kw["stop"])
        return cls(**kw, extra=extra or None)

    @classmethod
    def from_options(cls, options: SamplingOptions) -> SamplingKey:
        """From the services' validated options (defaults filled in): the same params, and so the
        same fingerprint, as `from_mapping(options.to_dict())`."""
        return cls(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            stop=tuple(options.stop),
            seed=options.seed,
            ignore_eos=options.ignore_eos,
            extra=options.adjustments() or None,
        )

    def canonical(self) -> dict[str, Any]:
        # 1 and 1.0 must give the same fingerprint; stop sequences act as a set.
        def num(v: float | None) -> float | None:
            if v is None:
                return None
            f = float(v)
            if not math.isfinite(f):
                raise ValueError(f"sampling parameter must be finite, got {v!r}")
            return f

        stops = {self.stop} if isinstance(self.stop, str) else set(self.stop or ())
        stop = sorted(stops) or None  # [] and None both mean "no stop sequence"
        return {
            "max_tokens": None if self.max_tokens is None else int(self.max_tokens),
            "temperature": num(self.temperature),
            "top_p": num(self.top_p),
            "top_k": None if self.top_k is None else int(self.top_k),
            "stop": stop,
            "seed": None if self.seed is None else int(self.seed),
            "ignore_eos": bool(self.ignore_eos),
            "extra": dict(self.extra) if self.extra else None,
        }


@dataclass(frozen=True)
class CacheRequest:
    """One request as the cache sees it; the services build it from their wire format."""

    tenant: str
    model: str
    kind: Kind
    prompt: str  # the last user message; the only part matched semantically
    context: Any = None  # JSON-able: system prompt, earlier turns, tools, response_format, ...
    sampling: SamplingKey = field(default_factory=SamplingKey)
    model_revision: str | None = None
    # The cache epoch (CacheSettings.epoch): bumping it makes every older entry unreadable at once.
    epoch: int = 0
    # Set by the service when this request must not read or write the cache
    # (e.g. Cache-Control: no-store, n > 1, logprobs).
    bypass: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError("tenant must be a non-empty string")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.prompt, str):
            raise ValueError("prompt must be a string")

    @property
    def model_label(self) -> str:
        return self.model if self.model_revision is None else f"{self.model}@{self.model_revision}"


def normalize_text(s: str) -> str:
    """The form of the last user message that exact keys are computed on.

    NFKC (full-width and compatibility forms fold to their plain form), invisible zero-width
    characters removed, every run of whitespace (any Unicode space, tabs, newlines) collapsed to one
    space, ends stripped, a sentence-initial capital lowered ("Why is" -> "why is"). Otherwise case
    and punctuation are kept: "US" vs "us", "2-3" vs "23", a trailing "?"
    or a code snippet's symbols can change the answer, and folding them is the semantic layer's job,
    which has a verifier behind it. Collapsing newlines can in principle merge two prompts that
    differ only in layout (e.g. Python indentation); accepted, since the exact layer is a hit-rate
    shortcut and such prompts are vanishingly rare as last user messages of a cache hit.
    """
    s = " ".join(unicodedata.normalize("NFKC", s).translate(_INVISIBLE).split())
    # Sentence case is the one case difference folded: "Why is the sky blue?" and "why is the sky
    # blue?" are one question typed two ways. Only a capital followed by a small letter at the very
    # start ("Why" -> "why"); "US", "I am" and every later word keep their case.
    if len(s) > 1 and s[0].isupper() and s[1].islower():
        s = s[0].lower() + s[1:]
    return s


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, no NaN. Raises TypeError if not JSON-able."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _sha256(domain: str, payload: str) -> str:
    # The domain string keeps a tenant tag from ever equalling a model tag or a fingerprint.
    # surrogatepass: a lone surrogate (possible in a Python str from JSON) must hash, not raise.
    h = hashlib.sha256(domain.encode())
    h.update(b"\x00")
    h.update(payload.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def tag_value(kind: Literal["tenant", "model"], value: str) -> str:
    """The TAG value stored and queried for a tenant or model: 64 hex chars, safe in any query."""
    return _sha256(f"semserve-{kind}", value)


def tenant_tag(tenant: str) -> str:
    return tag_value("tenant", tenant)


def model_tag(model: str) -> str:
    return tag_value("model", model)


def fingerprint(req: CacheRequest, schema_version: int = SCHEMA_VERSION) -> str:
    """sha256 over everything that changes the answer except the last user message (and tenant)."""
    payload: dict[str, Any] = {
        "v": schema_version,
        "model": req.model,
        "revision": req.model_revision,
        "kind": req.kind,
        "context": req.context,
        "sampling": req.sampling.canonical(),
    }
    if req.epoch:
        # Only when set, so epoch 0 keeps the keys entries were written under before epochs existed.
        payload["epoch"] = int(req.epoch)
    return _sha256("semserve-fingerprint", canonical_json(payload))


def scope_tag_from_fingerprint(tenant: str, request_fingerprint: str) -> str:
    """The scope TAG of `tenant`'s requests with this fingerprint: 64 hex chars, safe in any query.
    For callers that compute the fingerprint once for many entries (bench/scale.py)."""
    return _sha256("semserve-scope", canonical_json([tenant, request_fingerprint]))


def scope_tag(req: CacheRequest, schema_version: int = SCHEMA_VERSION) -> str:
    """The TAG a KNN filters on: only entries of the same tenant and fingerprint share it, so a
    paraphrase is compared only within one tenant's identical context."""
    return scope_tag_from_fingerprint(req.tenant, fingerprint(req, schema_version))


def exact_key(req: CacheRequest, schema_version: int = SCHEMA_VERSION) -> str:
    """sha256 of tenant + fingerprint + normalized last message. Also the entry's id in Redis."""
    payload = [req.tenant, fingerprint(req, schema_version), normalize_text(req.prompt)]
    return _sha256("semserve-exact", canonical_json(payload))
