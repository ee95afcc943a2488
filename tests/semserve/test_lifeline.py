"""semserve/lifeline.py: a child started by exec, and a multiprocessing (spawn) child, die with a
parent that is SIGKILLed; without the guard the spawn child outlives it (so the test can fail)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.support import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

EXEC_CHILD = """
import subprocess, sys, time
from semserve import lifeline
child = subprocess.Popen(lifeline.exec_prefix() + [sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""

SPAWN_CHILD = """
import multiprocessing, sys, time
from semserve import lifeline
if __name__ == "__main__":
    if sys.argv[1] == "guarded":
        lifeline.guard_children()
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    proc.start()
    print(proc.pid, flush=True)
    time.sleep(600)
"""


def _parent_and_child(code: str, *args: str) -> tuple[subprocess.Popen[str], psutil.Process]:
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"no child pid from the parent (exit {parent.poll()})"
    child = psutil.Process(int(line))
    # The exec prefix replaces itself with the real program: wait until it has.
    deadline = time.monotonic() + 10
    while "semserve.lifeline" in " ".join(child.cmdline()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return parent, child


def _kill_parent(parent: subprocess.Popen[str]) -> None:
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)


def test_exec_child_dies_with_its_sigkilled_parent() -> None:
    parent, child = _parent_and_child(EXEC_CHILD)
    assert child.cmdline()[-1].endswith("time.sleep(600)")
    _kill_parent(parent)
    _gone, alive = psutil.wait_procs([child], timeout=10)
    assert not alive, f"child {child.pid} outlived its parent"


def test_spawned_child_dies_with_its_sigkilled_parent() -> None:
    parent, child = _parent_and_child(SPAWN_CHILD, "guarded")
    _kill_parent(parent)
    _gone, alive = psutil.wait_procs([child], timeout=15)
    assert not alive, f"spawned child {child.pid} outlived its parent"


def test_unguarded_spawned_child_outlives_its_parent() -> None:
    """The control: what vLLM's engine did before (issue 29), so the test above can fail."""
    parent, child = _parent_and_child(SPAWN_CHILD, "plain")
    try:
        _kill_parent(parent)
        time.sleep(2 * 0.5 + 1)
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    finally:
        if child.is_running():
            os.kill(child.pid, signal.SIGKILL)
