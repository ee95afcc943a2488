"""Advisories as OSV and PyPI file them, and the answer each (name, version) query and each package
gets: clean, vulnerable or not audited (with the reason)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from semserve.tooling.dependency_audit.packages import canonical

Status = Literal["clean", "vulnerable", "not_audited"]
CLEAN: Status = "clean"
VULNERABLE: Status = "vulnerable"
NOT_AUDITED: Status = "not_audited"


@dataclass
class Advisory:
    id: str
    aliases: list[str]
    fixed_in: list[str]
    summary: str
    link: str
    source: str  # osv | pypi-version | pypi-latest
    package: str  # the name it was filed under (an upstream for audit_as packages)
    details_missing: bool = False
    excepted_by: dict[str, str] | None = None

    def ids(self) -> set[str]:
        return {self.id.upper(), *(a.upper() for a in self.aliases)}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shorten(text: Any, limit: int = 200) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def dedupe(advisories: list[Advisory]) -> list[Advisory]:
    """One entry per vulnerability: OSV lists a PYSEC and a GHSA record of the same one."""
    kept: list[Advisory] = []
    for adv in sorted(advisories, key=lambda a: (a.details_missing, a.id)):
        same = next((k for k in kept if k.ids() & adv.ids()), None)
        if same is None:
            kept.append(adv)
        else:
            for alias in sorted(adv.ids() - same.ids()):
                same.aliases.append(alias)
            same.fixed_in = sorted(set(same.fixed_in) | set(adv.fixed_in))
    return kept


def advisory_from_pypi(entry: dict[str, Any], package: str, source: str) -> Advisory | None:
    """An entry of PyPI's `vulnerabilities`; None when withdrawn."""
    if entry.get("withdrawn"):
        return None
    vid = str(entry.get("id") or "").strip()
    if not vid:
        return None
    return Advisory(
        id=vid,
        aliases=[str(a) for a in entry.get("aliases") or []],
        fixed_in=[str(v) for v in entry.get("fixed_in") or []],
        summary=shorten(entry.get("summary") or entry.get("details")),
        link=str(entry.get("link") or ""),
        source=source,
        package=package,
    )


def advisory_from_osv(vuln: dict[str, Any], package: str) -> Advisory | None:
    """An OSV vulnerability record; None when withdrawn."""
    if vuln.get("withdrawn"):
        return None
    fixed: set[str] = set()
    for affected in vuln.get("affected") or []:
        pkg = affected.get("package") or {}
        if pkg.get("ecosystem") != "PyPI" or canonical(str(pkg.get("name", ""))) != canonical(package):
            continue
        for rng in affected.get("ranges") or []:
            for event in rng.get("events") or []:
                if "fixed" in event:
                    fixed.add(str(event["fixed"]))
    vid = str(vuln["id"])
    return Advisory(
        id=vid,
        aliases=[str(a) for a in vuln.get("aliases") or []],
        fixed_in=sorted(fixed),
        summary=shorten(vuln.get("summary") or vuln.get("details")),
        link=f"https://osv.dev/vulnerability/{vid}",
        source="osv",
        package=package,
    )


@dataclass
class Query:
    """One (name, version) asked of the sources; a package has one, plus one per upstream."""

    name: str
    version: str
    source: str | None = None
    advisories: list[Advisory] | None = None  # None: no source could answer
    reason: str | None = None  # why not audited
    tried: list[str] = field(default_factory=list)  # what each source answered, when none could
    notes: list[str] = field(default_factory=list)

    def answer(self, source: str, advisories: list[Advisory], note: str | None = None) -> None:
        self.source, self.advisories, self.reason, self.tried = source, advisories, None, []
        if note:
            self.notes.append(note)


@dataclass
class PackageResult:
    name: str
    version: str
    queries: list[Query]
    status: Status = NOT_AUDITED
    advisories: list[Advisory] = field(default_factory=list)
    reason: str | None = None
    unauditable: str | None = None  # the policy's reason, when listed

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "status": self.status,
            "sources": sorted({q.source for q in self.queries if q.source}),
            "audited_as": [f"{q.name}=={q.version}" for q in self.queries],
            "advisories": [a.as_dict() for a in self.advisories],
            "reason": self.reason,
            "unauditable": self.unauditable,
            "tried": [f"{q.name}=={q.version}: {t}" for q in self.queries for t in q.tried],
            "notes": [n for q in self.queries for n in q.notes],
        }
