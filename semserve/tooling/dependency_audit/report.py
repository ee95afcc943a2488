"""The audit's outcome: exit status, verdict line, the JSON report and the table on stdout."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from semserve.tooling.dependency_audit.advisories import (
    CLEAN,
    NOT_AUDITED,
    VULNERABLE,
    Advisory,
    PackageResult,
    Status,
    shorten,
)
from semserve.tooling.dependency_audit.policy import Ignore, Policy
from semserve.tooling.dependency_audit.settings import AuditSettings

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_POLICY_ERROR = 2


@dataclass
class Report:
    results: list[PackageResult]
    policy: Policy
    settings: AuditSettings
    osv_error: str | None
    today: dt.date
    elapsed_s: float
    expired: list[Ignore] = field(default_factory=list)
    unused: list[Ignore] = field(default_factory=list)

    def count(self, status: Status) -> int:
        return sum(1 for r in self.results if r.status == status)

    def unexcepted(self) -> list[tuple[PackageResult, Advisory]]:
        return [(r, a) for r in self.results for a in r.advisories if a.excepted_by is None]

    def excepted(self) -> list[tuple[PackageResult, Advisory]]:
        return [(r, a) for r in self.results for a in r.advisories if a.excepted_by is not None]

    def uncovered(self) -> list[PackageResult]:
        """Not audited and not listed as unauditable: what --require-coverage fails on."""
        return [r for r in self.results if r.status == NOT_AUDITED and r.unauditable is None]

    def exit_status(self) -> int:
        if self.unexcepted():
            return EXIT_FAIL
        if self.settings.require_coverage and self.uncovered():
            return EXIT_FAIL
        return EXIT_OK

    def verdict(self) -> str:
        total = len(self.results)
        audited = total - self.count(NOT_AUDITED)
        vulns = self.unexcepted()
        parts = []
        if vulns:
            pkgs = sorted({r.name for r, _ in vulns})
            parts.append(
                f"FAILED: {len(vulns)} vulnerabilities without a live exception in {', '.join(pkgs)}"
            )
        if audited < total:
            uncovered = len(self.uncovered())
            head = "FAILED (--require-coverage)" if self.settings.require_coverage and uncovered else (
                "PARTIAL AUDIT"
            )
            parts.append(
                f"{head}: {audited} of {total} packages audited; {total - audited} not audited "
                f"({uncovered} not listed as unauditable)"
            )
        elif not vulns:
            parts.append(f"AUDIT OK: {audited} of {total} packages audited")
        if not vulns and self.excepted():
            parts.append(f"{len(self.excepted())} vulnerabilities accepted by exceptions")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        total = len(self.results)
        return {
            "schema": 1,
            "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "today": str(self.today),
            "elapsed_s": round(self.elapsed_s, 2),
            "sources": {
                "osv": {"url": self.settings.osv_url, "error": self.osv_error},
                "pypi": {"url": self.settings.pypi_url},
            },
            "policy": self.policy.path,
            "require_coverage": self.settings.require_coverage,
            "summary": {
                "total": total,
                "audited": total - self.count(NOT_AUDITED),
                "clean": self.count(CLEAN),
                "vulnerable": self.count(VULNERABLE),
                "not_audited": self.count(NOT_AUDITED),
                "not_audited_unauditable": self.count(NOT_AUDITED) - len(self.uncovered()),
                "vulnerabilities_unexcepted": len(self.unexcepted()),
                "vulnerabilities_excepted": len(self.excepted()),
                "exit_status": self.exit_status(),
                "verdict": self.verdict(),
            },
            "exceptions": {
                "expired": [i.as_dict() for i in self.expired],
                "unused": [i.as_dict() for i in self.unused],
            },
            "packages": [r.as_dict() for r in self.results],
        }



def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def render(report: Report) -> str:
    s = report.settings
    out = [
        f"Dependency audit of {len(report.results)} packages "
        f"(OSV {s.osv_url}: {'unreachable: ' + report.osv_error if report.osv_error else 'used'}; "
        f"PyPI {s.pypi_url}; policy {report.policy.path or 'none'}; {report.elapsed_s:.1f}s)",
    ]
    vuln_rows = [
        [r.name, r.version, a.id, ",".join(sorted(a.aliases)[:3]) or "-", ",".join(a.fixed_in) or "-",
         f"excepted until {a.excepted_by['until']}" if a.excepted_by else "NOT EXCEPTED"]
        for r in report.results for a in r.advisories
    ]
    if vuln_rows:
        out += ["", f"VULNERABLE ({report.count(VULNERABLE)} packages, {len(vuln_rows)} advisories)"]
        out.append(table(vuln_rows, ["package", "version", "advisory", "aliases", "fixed in", "status"]))
    missing = [r for r in report.results if r.status == NOT_AUDITED]
    if missing:
        out += ["", f"NOT AUDITED ({len(missing)} of {len(report.results)} packages)"]
        out.append(table(
            [[r.name, r.version, ("unauditable: " + r.unauditable) if r.unauditable else "-",
              shorten(r.reason, 200)] for r in missing],
            ["package", "version", "policy", "why"],
        ))
    for ign in report.expired:
        out.append(f"note: exception {ign.id} ({ign.package}) expired on {ign.until}: it no longer applies")
    for ign in report.unused:
        out.append(f"note: exception {ign.id} ({ign.package}) matched no finding: remove it?")
    out += ["", report.verdict()]
    return "\n".join(out)
