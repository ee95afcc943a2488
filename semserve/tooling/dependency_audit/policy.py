"""The policy file (.ci/audit-exceptions.toml): advisories accepted for a while, packages no source
can know, and rebuilds audited under their upstream's name. An invalid file stops the audit."""

from __future__ import annotations

import datetime as dt
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semserve.tooling.dependency_audit.advisories import Advisory
from semserve.tooling.dependency_audit.packages import canonical


class PolicyError(ValueError):
    """The policy file is invalid: the audit refuses to run on it."""


@dataclass(frozen=True)
class Ignore:
    id: str
    package: str
    reason: str
    until: dt.date

    def live(self, today: dt.date) -> bool:
        return today <= self.until

    def matches(self, package: str, advisory: Advisory) -> bool:
        return canonical(self.package) == canonical(package) and self.id.upper() in advisory.ids()

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "package": self.package, "reason": self.reason, "until": str(self.until)}


@dataclass(frozen=True)
class Unauditable:
    package: str
    reason: str


@dataclass(frozen=True)
class AuditAs:
    package: str
    upstream: str
    reason: str


@dataclass(frozen=True)
class Policy:
    path: str | None = None
    ignores: tuple[Ignore, ...] = ()
    unauditable: tuple[Unauditable, ...] = ()
    audit_as: tuple[AuditAs, ...] = ()

    def unauditable_reason(self, package: str) -> str | None:
        for u in self.unauditable:
            if canonical(u.package) == canonical(package):
                return u.reason
        return None

    def upstreams(self, package: str) -> list[str]:
        return [a.upstream for a in self.audit_as if canonical(a.package) == canonical(package)]


# Every key of each table is required: an exception names what, where, why and until when.
_TABLE_KEYS = {
    "ignore": {"id", "package", "reason", "until"},
    "unauditable": {"package", "reason"},
    "audit_as": {"package", "upstream", "reason"},
}


def _entries(doc: dict[str, Any], table: str, where: str) -> list[dict[str, Any]]:
    raw = doc.get(table, [])
    if not isinstance(raw, list):
        raise PolicyError(f"{where}: [[{table}]] must be an array of tables")
    required = _TABLE_KEYS[table]
    out = []
    for i, entry in enumerate(raw):
        at = f"{where}: [[{table}]] #{i + 1}"
        if not isinstance(entry, dict):
            raise PolicyError(f"{at}: not a table")
        unknown = set(entry) - required
        if unknown:
            raise PolicyError(f"{at}: unknown key(s) {sorted(unknown)}")
        for key in sorted(required):
            value = entry.get(key)
            if key == "until" and isinstance(value, dt.date):
                continue
            if not isinstance(value, str) or not value.strip():
                what = "a reason (why it is safe to accept)" if key == "reason" else f"`{key}`"
                raise PolicyError(f"{at} ({entry.get('id') or entry.get('package')}): needs {what}")
        out.append(entry)
    return out


def _date(value: Any, at: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value).strip())
    except ValueError as exc:
        raise PolicyError(f"{at}: until must be a date YYYY-MM-DD, got {value!r}") from exc


def parse_policy(doc: dict[str, Any], where: str = "policy") -> Policy:
    unknown = set(doc) - set(_TABLE_KEYS)
    if unknown:
        raise PolicyError(f"{where}: unknown table(s) {sorted(unknown)}; expected {sorted(_TABLE_KEYS)}")
    ignores = tuple(
        Ignore(e["id"].strip(), e["package"].strip(), e["reason"].strip(), _date(e["until"], where))
        for e in _entries(doc, "ignore", where)
    )
    unauditable = tuple(
        Unauditable(e["package"].strip(), e["reason"].strip()) for e in _entries(doc, "unauditable", where)
    )
    audit_as = tuple(
        AuditAs(e["package"].strip(), e["upstream"].strip(), e["reason"].strip())
        for e in _entries(doc, "audit_as", where)
    )
    return Policy(where, ignores, unauditable, audit_as)


def load_policy(path: Path | None, *, required: bool = False) -> Policy:
    if path is None:
        return Policy()
    if not path.exists():
        if required:
            raise PolicyError(f"{path}: no such policy file")
        return Policy()
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: {exc}") from exc
    return parse_policy(doc, str(path))
