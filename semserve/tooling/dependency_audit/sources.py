"""The advisory sources over HTTP, within the audit's deadline: OSV's querybatch for exact versions
first, then PyPI's per-version JSON, then its project JSON (authoritative for the latest release
only)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from semserve.tooling.dependency_audit.advisories import Query, advisory_from_pypi, shorten
from semserve.tooling.dependency_audit.packages import same_version
from semserve.tooling.dependency_audit.settings import AuditSettings

OSV_BATCH_MAX = 1000  # OSV's limit of queries in one querybatch
OSV_MAX_PAGES = 20


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


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return shorten(f"{type(exc).__name__}: {text}", 160)


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
            self.osv_error = describe_error(exc)
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
            tried.append(f"PyPI per-version JSON: {describe_error(exc)}")
        try:
            status, body = self._get_json(f"{self.pypi_url}/pypi/{q.name}/json")
        except DeadlineExceeded as exc:
            q.reason = str(exc)
            return q
        except (httpx.HTTPError, ValueError) as exc:
            tried.append(f"PyPI project JSON: {describe_error(exc)}")
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
