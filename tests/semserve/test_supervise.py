"""semserve/supervise.py's bookkeeping of processes: identity by pid and start time, a child's exit
takes its process group along, the next run stops only what a dead supervisor left, and up.json is
read as stopped once its supervisor is gone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from semserve.supervise import (
    Component,
    ProcessRef,
    StackRunning,
    Supervisor,
    read_status,
    stop_leftovers,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def _sleeper(code: str = "import time; time.sleep(600)") -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)  # the handler is in place
    return proc


def _dead_ref() -> ProcessRef:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    ref = ProcessRef.of(proc.pid)
    proc.wait()
    assert ref is not None and not ref.alive()
    return ref


def _write_up_json(path: Path, supervisor: ProcessRef, components: dict[str, list[ProcessRef]]) -> None:
    comps = [{"name": n, "state": "ready", "pid": refs[0].pid, "processes": [asdict(r) for r in refs]}
             for n, refs in components.items()]  # fmt: skip
    path.write_text(json.dumps({"supervisor": asdict(supervisor), "components": comps}))


def test_a_process_is_its_pid_and_start_time() -> None:
    proc = _sleeper()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref is not None and ref.alive()
        assert not ProcessRef(proc.pid, ref.start_ticks + 1).alive()  # the pid, reused later
    finally:
        proc.kill()
        proc.wait()
    assert not ref.alive() and ProcessRef.of(proc.pid) is None


def test_leftovers_of_a_dead_supervisor_are_stopped_and_nothing_else(tmp_path: Path) -> None:
    ours, stubborn, stranger = _sleeper(), _sleeper(IGNORES_TERM), _sleeper()
    said: list[str] = []
    try:
        ours_ref, stubborn_ref, stranger_ref = (ProcessRef.of(p.pid) for p in (ours, stubborn, stranger))
        assert ours_ref and stubborn_ref and stranger_ref
        # The stranger's pid is recorded, but with another start time: a reused pid, not ours.
        _write_up_json(tmp_path / "up.json", _dead_ref(), {
            "redis": [ours_ref], "predictor": [stubborn_ref],
            "transformer": [ProcessRef(stranger.pid, stranger_ref.start_ticks - 1)],
        })  # fmt: skip
        stop_leftovers(tmp_path / "up.json", said.append, grace_s=2)
        assert ours.wait(5) == -signal.SIGTERM
        assert stubborn.wait(5) == -signal.SIGKILL  # ignored SIGTERM: killed after the grace
        assert stranger.poll() is None
        assert len(said) == 1 and f"redis (pid {ours.pid})" in said[0]
        assert f"predictor (pid {stubborn.pid})" in said[0] and "transformer" not in said[0]
    finally:
        for p in (ours, stubborn, stranger):
            p.kill()
            p.wait()


def test_a_running_stack_is_not_a_leftover(tmp_path: Path) -> None:
    supervisor, child = _sleeper(), _sleeper()
    try:
        sup_ref, child_ref = ProcessRef.of(supervisor.pid), ProcessRef.of(child.pid)
        assert sup_ref and child_ref
        _write_up_json(tmp_path / "up.json", sup_ref, {"redis": [child_ref]})
        with pytest.raises(StackRunning, match=f"pid {supervisor.pid}"):
            stop_leftovers(tmp_path / "up.json", print)
        assert child.poll() is None
        assert [s.state for s in read_status(tmp_path / "up.json")] == ["ready"]
        supervisor.kill()
        supervisor.wait()
        # Its supervisor gone, the stack is not ready, whatever the file says.
        assert [s.state for s in read_status(tmp_path / "up.json")] == ["stopped"]
    finally:
        for p in (supervisor, child):
            p.kill()
            p.wait()


def test_an_exiting_child_takes_its_process_group_along(tmp_path: Path) -> None:
    """What a child started (vLLM's engine for the predictor) does not outlive it."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(g.pid)); time.sleep(1.5)"
    )
    sup = Supervisor([Component("parent", [sys.executable, "-c", code], [], lambda: True)], tmp_path,
                     say=lambda _m: None)  # fmt: skip
    try:
        sup.start_all()
        deadline = time.monotonic() + 20
        while sup.statuses()[0].restarts == 0 and time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.1)
        assert sup.statuses()[0].restarts == 1
        grandchild = int(pid_file.read_text())
        assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"
    finally:
        sup.stop_all(grace_s=5)
