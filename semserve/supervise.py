"""Child processes kept running the way Kubernetes keeps containers running: one that exits is
restarted on its own, with a growing back-off, while the others go on serving.

`semserve up` (the local stack) is the user; the supervisor knows nothing about what it runs.
A component that exits before it was ever ready is a start failure (a taken port, a bad model
path): the supervisor gives up rather than restart it forever, as a first `make run` should fail
fast with the log to read. After a component was ready once, every exit is a crash to recover from.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Seconds before restart n (1-based): 1, 2, 4, ... capped; reset once a component stays ready.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# Ready this long after a restart: the next crash starts the back-off from the beginning again.
STABLE_AFTER_S = 60.0


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    ports: list[int]
    # Says whether the running process serves (an HTTP readiness probe, a Redis PING).
    ready: Callable[[], bool]


@dataclass
class ComponentStatus:
    """What `up.json` says of one component (tests and people read it)."""

    name: str
    state: str = "starting"  # starting | ready | restarting | failed | stopped
    pid: int | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    started_at: float = 0.0
    ready_at: float | None = None


@dataclass
class _Slot:
    comp: Component
    status: ComponentStatus
    proc: subprocess.Popen[bytes] | None = None
    ever_ready: bool = False
    restart_at: float | None = None
    backoff_s: float = BACKOFF_FIRST_S


class StartFailed(RuntimeError):
    """A component exited, or never became ready, on its first start."""


@dataclass
class Supervisor:
    components: list[Component]
    log_dir: Path
    ready_timeout_s: float = 600.0
    say: Callable[[str], None] = print
    env: dict[str, str] = field(default_factory=dict)
    _slots: list[_Slot] = field(default_factory=list, init=False)

    @property
    def status_path(self) -> Path:
        return self.log_dir / "up.json"

    def start_all(self) -> None:
        """Every component at once: the transformer serves cache hits (and says the predictor is
        down for misses) long before the predictor's engine has loaded."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for comp in self.components:
            slot = _Slot(comp, ComponentStatus(comp.name))
            self._slots.append(slot)
            self._spawn(slot)
        self._write_status()

    def _spawn(self, slot: _Slot) -> None:
        log_path = self.log_dir / f"{slot.comp.name}.log"
        with log_path.open("ab") as log:
            slot.proc = subprocess.Popen(
                slot.comp.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a terminal's Ctrl-C reaches only us, and we stop children in order.
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        slot.status.pid = slot.proc.pid
        slot.status.state = "starting"
        slot.status.started_at = time.time()
        slot.status.ready_at = None
        slot.restart_at = None
        self.say(f"==> starting {slot.comp.name} (pid {slot.proc.pid}, log: {log_path})")

    def poll(self) -> bool:
        """One round: notice exits, schedule and run restarts, notice readiness. True once every
        component is ready. Raises StartFailed for a component that fails its first start."""
        now = time.monotonic()
        changed = False
        for slot in self._slots:
            st = slot.status
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    self._spawn(slot)
                    changed = True
                continue
            assert slot.proc is not None
            code = slot.proc.poll()
            if code is not None:
                st.last_exit_code = code
                st.pid = None
                log_path = self.log_dir / f"{slot.comp.name}.log"
                if not slot.ever_ready:
                    st.state = "failed"
                    self._write_status()
                    raise StartFailed(
                        f"{slot.comp.name} exited with {code} before it was ready; see {log_path}"
                    )
                st.restarts += 1
                st.state = "restarting"
                slot.restart_at = now + slot.backoff_s
                self.say(
                    f"{slot.comp.name} exited with {code}; restarting in {slot.backoff_s:g}s "
                    f"(restart {st.restarts}; the others keep serving; log: {log_path})"
                )
                slot.backoff_s = min(slot.backoff_s * 2, BACKOFF_MAX_S)
                changed = True
                continue
            if st.state == "starting":
                if slot.comp.ready():
                    st.state = "ready"
                    st.ready_at = time.time()
                    took = st.ready_at - st.started_at
                    again = f" again (restart {st.restarts})" if st.restarts else ""
                    self.say(f"    {slot.comp.name} ready{again} in {took:.0f}s")
                    slot.ever_ready = True
                    changed = True
                elif not slot.ever_ready and time.time() - st.started_at > self.ready_timeout_s:
                    st.state = "failed"
                    self._write_status()
                    raise StartFailed(
                        f"{slot.comp.name} not ready after {self.ready_timeout_s:g}s; "
                        f"see {self.log_dir / (slot.comp.name + '.log')}"
                    )
            elif st.state == "ready" and st.ready_at and time.time() - st.ready_at > STABLE_AFTER_S:
                slot.backoff_s = BACKOFF_FIRST_S
        if changed:
            self._write_status()
        return all(s.status.state == "ready" for s in self._slots)

    def waiting_for(self) -> list[str]:
        return [s.comp.name for s in self._slots if s.status.state != "ready"]

    def statuses(self) -> list[ComponentStatus]:
        return [s.status for s in self._slots]

    def stop_all(self, grace_s: float = 60.0) -> None:
        """SIGTERM in reverse start order (the transformer before the predictor and Redis it uses),
        then wait; a child still running after `grace_s` is killed."""
        running = [s for s in reversed(self._slots) if s.proc is not None and s.proc.poll() is None]
        for slot in running:
            self.say(f"==> stopping {slot.comp.name}")
            assert slot.proc is not None
            slot.proc.terminate()
        deadline = time.monotonic() + grace_s
        for slot in running:
            assert slot.proc is not None
            try:
                slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
        for slot in self._slots:
            slot.status.state = "stopped"
            slot.status.pid = None
        if self._slots:
            self._write_status()

    def _write_status(self) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"components": [asdict(s) for s in self.statuses()]}, indent=1))
        tmp.replace(self.status_path)  # readers never see half a file
