"""Child processes kept running the way Kubernetes keeps containers running: one that exits is
restarted on its own, with a growing back-off, while the others go on serving.

`semserve up` (the local stack) is the user; the supervisor knows nothing about what it runs.
A component that exits before it was ever ready is a start failure (a taken port, a bad model
path): the supervisor gives up rather than restart it forever, as a first `make run` should fail
fast with the log to read. After a component was ready once, every exit is a crash to recover from.

Nothing outlives the supervisor: each child gets a parent-death signal (semserve/lifeline.py), a
child's exit takes its whole process group with it (what it started, e.g. vLLM's engine), and
`up.json` names the supervisor and every process by pid and start time, so that the next run can
tell whether a recorded process is still the one it started (`stop_leftovers`) and a reader can
tell a dead stack from a ready one (`read_status`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from semserve import lifeline

# Seconds before restart n (1-based): 1, 2, 4, ... capped; reset once a component stays ready.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# Ready this long after a restart: the next crash starts the back-off from the beginning again.
STABLE_AFTER_S = 60.0
# How often up.json's process list is refreshed (a child's children appear while it starts).
REFRESH_PROCESSES_S = 5.0


@dataclass(frozen=True)
class ProcessRef:
    """One process, told apart from a later one that reuses its pid by its start time (clock ticks
    after boot, /proc/PID/stat). The command line is not compared: exec and setproctitle change it
    (vLLM's engine renames itself VLLM::EngineCore)."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        ticks = _start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    @classmethod
    def from_json(cls, data: Any) -> ProcessRef | None:
        try:
            return cls(int(data["pid"]), int(data["start_ticks"]))
        except (TypeError, KeyError, ValueError):
            return None

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses); None when
    the process is gone, is a zombie, or there is no /proc (not Linux)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return None if not fields or fields[0] in ("Z", "X") else fields


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat; fields[0] is field 3


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(int(entry.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


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
    # The child and what it started, as last seen: what the next run stops if this one dies.
    processes: list[ProcessRef] = field(default_factory=list)


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


class StackRunning(RuntimeError):
    """The supervisor recorded in up.json is still running."""


@dataclass
class Supervisor:
    components: list[Component]
    log_dir: Path
    ready_timeout_s: float = 600.0
    say: Callable[[str], None] = print
    env: dict[str, str] = field(default_factory=dict)
    _slots: list[_Slot] = field(default_factory=list, init=False)
    _refreshed_at: float = field(default=0.0, init=False)

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
                # Gets SIGTERM when we die, however we die (spawned from the main thread).
                lifeline.exec_prefix() + slot.comp.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a terminal's Ctrl-C reaches only us, and we stop children in order.
                # Also its own process group, which goes with it when it exits (_exit_code).
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
            code = _exit_code(slot.proc)
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
        if changed or time.monotonic() - self._refreshed_at > REFRESH_PROCESSES_S:
            self._write_status()
        return all(s.status.state == "ready" for s in self._slots)

    def waiting_for(self) -> list[str]:
        return [s.comp.name for s in self._slots if s.status.state != "ready"]

    def statuses(self) -> list[ComponentStatus]:
        return [s.status for s in self._slots]

    def stop_all(self, grace_s: float = 60.0) -> None:
        """SIGTERM in reverse start order (the transformer before the predictor and Redis it uses),
        then wait; a child still running after `grace_s` is killed."""
        running = [s.proc for s in reversed(self._slots) if s.proc is not None and s.proc.poll() is None]
        for slot in reversed(self._slots):
            if slot.proc in running:
                self.say(f"==> stopping {slot.comp.name}")
                slot.proc.terminate()
        deadline = time.monotonic() + grace_s
        while running:
            running = [p for p in running if _exit_code(p) is None]
            if running and time.monotonic() > deadline:
                for proc in running:
                    proc.kill()
                deadline = float("inf")
            time.sleep(0.1)
        for slot in self._slots:
            slot.status.state = "stopped"
            slot.status.pid = None
        if self._slots:
            self._write_status()

    def _write_status(self) -> None:
        self._refreshed_at = time.monotonic()
        for slot in self._slots:
            pids = [slot.proc.pid, *descendants(slot.proc.pid)] if slot.status.pid and slot.proc else []
            slot.status.processes = [r for r in map(ProcessRef.of, pids) if r is not None]
        me = ProcessRef.of(os.getpid())  # None without /proc: then readers cannot check it
        data = {"supervisor": asdict(me) if me else None, "components": [asdict(s) for s in self.statuses()]}
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.status_path)  # readers never see half a file


def _exit_code(proc: subprocess.Popen[bytes]) -> int | None:
    """The child's exit code once it has exited, else None. On exit, its process group (what it
    started and left behind) is killed first: until reaped, the exited child still holds its pid,
    so the group id cannot have passed to anyone else's processes."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, AttributeError):  # reaped already; no waitid (not POSIX)
        return proc.poll()
    if exited is None:
        return None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass  # nothing left in the group
    return proc.wait()


def _read(path: Path) -> tuple[ProcessRef | None, list[ComponentStatus]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, []
    comps = []
    for c in data.get("components", []):
        refs = [r for r in map(ProcessRef.from_json, c.get("processes", [])) if r is not None]
        known = {k: v for k, v in c.items() if k in ComponentStatus.__dataclass_fields__}
        comps.append(ComponentStatus(**{**known, "processes": refs}))
    return ProcessRef.from_json(data.get("supervisor")), comps


def read_status(path: Path) -> list[ComponentStatus]:
    """up.json as it stands: every component "stopped" when the supervisor that wrote it is gone
    (killed with SIGKILL it could not say so itself)."""
    supervisor, comps = _read(path)
    if supervisor is not None and not supervisor.alive():
        for c in comps:
            c.state, c.pid = "stopped", None
    return comps


def stop_leftovers(path: Path, say: Callable[[str], None], grace_s: float = 10.0) -> None:
    """Stop what a previous supervisor, now dead, started and left running (recorded in up.json at
    `path`). Only processes whose pid and start time both match the record are touched. Raises
    StackRunning when that supervisor is alive: it is not a leftover but a running stack."""
    supervisor, comps = _read(path)
    if supervisor is not None and supervisor.pid != os.getpid() and supervisor.alive():
        raise StackRunning(
            f"another `semserve up` (pid {supervisor.pid}) is running with {path}; stop it first"
        )
    found = [(c.name, r) for c in comps for r in c.processes if r.alive()]
    if not found:
        return
    names = ", ".join(f"{name} (pid {r.pid})" for name, r in found)
    who = f" (pid {supervisor.pid})" if supervisor else ""
    say(f"==> the previous `semserve up`{who} died and left {names} running: stopping them")
    for _name, r in found:
        _signal(r, signal.SIGTERM)
        _signal(r, signal.SIGCONT)  # one stopped (Ctrl-Z, SIGSTOP) acts on SIGTERM only once resumed
    deadline = time.monotonic() + grace_s
    while any(r.alive() for _n, r in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _name, r in found:
        _signal(r, signal.SIGKILL)


def _signal(ref: ProcessRef, sig: int) -> None:
    if ref.alive():  # checked right before: the pid is still the process we started
        try:
            os.kill(ref.pid, sig)
        except OSError:
            pass
