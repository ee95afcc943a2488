"""The audit's settings (SEMSERVE_AUDIT_*): advisory sources, policy file, limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semserve.config import Settings, setting


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
