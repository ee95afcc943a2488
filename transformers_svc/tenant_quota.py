"""The tenant limits in force: the --tenant-limits-file as loaded at start, re-read when it changes.

A Kubernetes ConfigMap volume updates the file by swapping a symlink (`..data`) to a new directory,
so the path's own mtime may not move: the file is identified by its resolved path, inode, mtime and
size, polled every `poll_s`. A new version that does not parse is logged (error) and the limits in
force are kept; a bad file at start is the caller's to refuse (LimitsError).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from semserve.logs import get_logger
from semserve.tenant_limits import LimitsError, LimitsTable, TenantLimits

log = get_logger("semserve.transformer.limits")

POLL_S = 2.0  # how often the file is checked for a new version


def _version(path: Path) -> tuple[str, int, int, int] | None:
    """What identifies the file's content on disk; None when it cannot be read."""
    try:
        st = path.stat()  # follows the symlinks: the file they lead to now
        return os.path.realpath(path), st.st_ino, st.st_mtime_ns, st.st_size
    except OSError:
        return None


class TenantQuotas:
    """Every tenant's limits, kept current with the file they come from (None: no file)."""

    def __init__(self, path: Path | None, poll_s: float = POLL_S) -> None:
        self.path = path
        self.poll_s = poll_s
        self._version = _version(path) if path is not None else None
        # Raises LimitsError (naming tenant and field) for a bad file: the transformer stops.
        self.table = LimitsTable.load(path) if path is not None else LimitsTable({})
        self._task: asyncio.Task[None] | None = None
        if path is not None:
            log.info("tenant_limits_loaded", path=str(path), tenants=sorted(self.table.entries))

    def of(self, tenant: str) -> TenantLimits:
        return self.table.of(tenant)

    @property
    def any_limited(self) -> bool:
        """Whether some tenant has a limit (else no request need look at Redis)."""
        return any(limits.limited for limits in self.table.entries.values())

    def reload(self) -> bool:
        """Re-read the file if it changed; True when a new table is in force."""
        if self.path is None:
            return False
        version = _version(self.path)
        if version is None or version == self._version:
            return False
        self._version = version
        try:
            table = LimitsTable.load(self.path)
        except LimitsError as exc:
            log.error("tenant_limits_rejected", path=str(self.path), error=str(exc),
                      kept="the limits in force")
            return False
        self.table = table
        log.info("tenant_limits_reloaded", path=str(self.path), tenants=sorted(table.entries))
        return True

    def start(self) -> None:
        """Poll the file from now on (in the running event loop)."""
        if self.path is not None and self._task is None:
            self._task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.reload()
            except Exception:  # never let the poller die: the limits in force stay
                log.exception("tenant_limits_reload_failed", path=str(self.path))
