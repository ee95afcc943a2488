"""The audit itself: every query asked of OSV at once, PyPI for what OSV did not answer (in a
thread pool, within the deadline), then each package classified against the policy."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from semserve.tooling.dependency_audit.advisories import (
    CLEAN,
    NOT_AUDITED,
    VULNERABLE,
    Advisory,
    PackageResult,
    Query,
    advisory_from_osv,
    dedupe,
)
from semserve.tooling.dependency_audit.packages import Dist, public_version
from semserve.tooling.dependency_audit.policy import Ignore, Policy
from semserve.tooling.dependency_audit.report import Report
from semserve.tooling.dependency_audit.settings import AuditSettings
from semserve.tooling.dependency_audit.sources import Deadline, Sources, describe_error


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
    advisories = dedupe([a for q in result.queries for a in q.advisories or []])
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
                q.reason = f"lookup failed ({describe_error(lookup.exception() or Exception())})"
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
