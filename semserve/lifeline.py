"""Child processes that die with the process that started them, however it dies (SIGKILL, OOM).

Two kinds of child, one mechanism each (Linux; elsewhere both are no-ops):

- A program started by exec (`semserve up`'s servers, the Redis server): `exec_prefix()` goes in
  front of its argv. That runs `python -m semserve.lifeline`, which asks the kernel for a
  parent-death signal (prctl PR_SET_PDEATHSIG, kept across exec) and then execs the real program.
  After exec, not in a `preexec_fn`: Python code between fork and exec crashed children of a
  multithreaded parent (pytest with worker threads). The kernel sends the signal when the *thread*
  that forked exits, so the prefix is only given on the main thread, which lives as long as its
  process.
- A multiprocessing child (vLLM's EngineCore, spawned by the predictor, and the engine's Workers):
  vLLM starts it from whichever thread builds the engine and offers no hook, so the kernel's
  signal cannot be keyed to the right thread. `guard_children()` wraps the target of every
  multiprocessing child this process starts afterwards (spawn pickles the wrapper by reference);
  in the child, a thread checks twice a second whether its parent is still the one that started
  it, and ends the child when not (SIGTERM, then SIGKILL after a grace: vLLM's engine may ignore
  SIGTERM for seconds). A wrapped child guards its own children the same way.

    python -m semserve.lifeline --parent PID -- PROGRAM ARGS...   # what exec_prefix() runs
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_INTERVAL_S = 0.5
# SIGTERM first (a clean shutdown), SIGKILL this long after if the child is still there.
WATCH_GRACE_S = 5.0


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` to this process when the thread that forked it exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def exec_prefix() -> list[str]:
    """argv prefix that makes the program get SIGTERM when this process dies (see module doc)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return []
    return [sys.executable, "-m", "semserve.lifeline", "--parent", str(os.getpid()), "--"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 4 or args[0] != "--parent" or args[2] != "--":
        print("usage: python -m semserve.lifeline --parent PID -- PROGRAM ARGS...", file=sys.stderr)
        return 2
    parent, program = int(args[1]), args[3:]
    set_parent_death_signal(signal.SIGTERM)
    # The parent may have died between our fork and the prctl: then no signal will ever come.
    if os.getppid() != parent:
        return 1
    os.execvp(program[0], program)
    return 127  # not reached: execvp raises on failure


def guard_children() -> None:
    """From now on every multiprocessing child of this process ends when this process does."""
    if getattr(multiprocessing.process.BaseProcess.start, "_semserve_guarded", False):
        return
    original = multiprocessing.process.BaseProcess.start

    def start(self: multiprocessing.process.BaseProcess) -> None:
        target = getattr(self, "_target", None)
        if target is not None and not _is_wrapped(target):
            # A partial of a module-level function pickles by reference, as the target itself did.
            # Our pid goes along: a child that starts after we died must notice it too.
            self._target = functools.partial(_run_watched, os.getpid(), target)  # type: ignore[attr-defined]
        original(self)

    start._semserve_guarded = True  # type: ignore[attr-defined]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]


def _is_wrapped(target: object) -> bool:
    return isinstance(target, functools.partial) and target.func is _run_watched


def _run_watched(parent: int, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    watch_parent(parent)
    guard_children()
    return target(*args, **kwargs)


def watch_parent(
    parent: int | None = None, interval_s: float = WATCH_INTERVAL_S, grace_s: float = WATCH_GRACE_S
) -> None:
    """End this process once `parent` (default: the current one) is no longer its parent: a
    process whose parent dies is re-parented, so getppid changes."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="semserve-lifeline", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
