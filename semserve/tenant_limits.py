"""Per-tenant limits: the typed form of the tenant limits file (the transformer's
--tenant-limits-file) and of `semserve tenant create/update`'s limit flags, with the one strict
parser both use, so a bad value is refused the same way wherever it is written.

The file is a JSON object: each key a tenant name, or "default" for tenants without an entry of
their own; each value an object with any of the fields of TenantLimits. A missing field is no limit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT = "default"


class LimitsError(ValueError):
    """A limits file or value that cannot be used; the message names the tenant and the field."""


@dataclass(frozen=True)
class TenantLimits:
    requests_per_minute: int | None = None  # requests (hits included) per minute
    tokens_per_minute: int | None = None  # prompt + completion tokens of predictor generations
    max_concurrent: int | None = None  # misses in flight at the predictor
    weight: float = 1.0  # share of the predictor when tenants compete

    @property
    def limited(self) -> bool:
        limits = (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent)
        return any(v is not None for v in limits)

    def as_json(self) -> dict[str, Any]:
        """The entry as the file writes it (only the fields that are set)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not (f.name == "weight" and value == 1.0):
                out[f.name] = value
        return out


_INT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
FIELDS = (*_INT_FIELDS, "weight")


def parse_entry(tenant: str, raw: object) -> TenantLimits:
    """One tenant's entry, checked field by field."""
    if not isinstance(raw, dict):
        raise LimitsError(f"tenant {tenant!r}: expected an object of limits, got {type(raw).__name__}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in FIELDS:
            raise LimitsError(f"tenant {tenant!r}: unknown field {name!r} (known: {', '.join(FIELDS)})")
        if name in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LimitsError(f"tenant {tenant!r}: field {name!r} must be an integer, got {value!r}")
            if value < 0:
                raise LimitsError(f"tenant {tenant!r}: field {name!r} must not be negative, got {value}")
        else:  # weight
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise LimitsError(f"tenant {tenant!r}: field 'weight' must be a number, got {value!r}")
            if value <= 0:
                raise LimitsError(f"tenant {tenant!r}: field 'weight' must be above 0, got {value}")
            value = float(value)
        values[name] = value
    return TenantLimits(**values)


@dataclass(frozen=True)
class LimitsTable:
    """Every tenant's limits; `of` gives a tenant its own entry, else the default one."""

    entries: dict[str, TenantLimits]

    def of(self, tenant: str) -> TenantLimits:
        return self.entries.get(tenant) or self.entries.get(DEFAULT) or TenantLimits()

    @classmethod
    def parse(cls, document: object) -> LimitsTable:
        if not isinstance(document, dict):
            kind = type(document).__name__
            raise LimitsError(f"tenant limits: expected a JSON object {{tenant: limits}}, got {kind}")
        return cls({str(tenant): parse_entry(str(tenant), raw) for tenant, raw in document.items()})

    @classmethod
    def load(cls, path: Path) -> LimitsTable:
        try:
            document = json.loads(path.read_text())
        except OSError as exc:
            raise LimitsError(f"tenant limits file {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise LimitsError(f"tenant limits file {path}: invalid JSON at {where}: {exc.msg}") from None
        try:
            return cls.parse(document)
        except LimitsError as exc:
            raise LimitsError(f"tenant limits file {path}: {exc}") from None

    def as_json(self) -> dict[str, Any]:
        return {tenant: limits.as_json() for tenant, limits in self.entries.items()}
