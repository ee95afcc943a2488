"""The local Redis launcher."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from semserve.tooling.local_redis import PortInUseError, RedisServer, free_port


def test_session_server_has_search(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    names = {m[b"name"] for m in client.module_list()}
    assert b"search" in names and redis_server.running
    assert redis_server.logfile.exists()
    client.close()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=str(port)):
            RedisServer(port=port, data_dir=tmp_path).start()


def test_module_runs_in_foreground_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "semserve.tooling.local_redis", "--port", str(port),
         "--data-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        client = redis.Redis(port=port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stderr:
            proc.stderr.close()
    with socket.socket() as s:  # the server went down with it
        assert s.connect_ex(("127.0.0.1", port)) != 0


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, just not yet reaped
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_server_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    # A launcher killed with SIGKILL (a CI timeout, an OOM kill) must not leave its Redis running.
    port = free_port()
    script = (
        "import sys, time\n"
        "from semserve.tooling.local_redis import RedisServer\n"
        f"s = RedisServer(port={port}, data_dir={str(tmp_path)!r}).start()\n"
        "print(s.process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        redis_pid = int(launcher.stdout.readline())
        assert _pid_alive(redis_pid)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 15
        while _pid_alive(redis_pid):
            assert time.monotonic() < deadline, f"Redis pid {redis_pid} outlived its SIGKILLed launcher"
            time.sleep(0.1)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if launcher.stdout:
            launcher.stdout.close()


def test_start_from_worker_threads_while_others_run(tmp_path: Path) -> None:
    # Regression: a Python preexec_fn ran between fork and exec and crashed the child with SIGSEGV when
    # Redis was (re)started through asyncio.to_thread while other threads were busy. The server must also
    # outlive the worker thread that started it (the parent-death signal follows the forking thread).
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))  # holds and releases the GIL and allocates, like a loaded test

    servers: list[RedisServer] = []
    burners = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
    for t in burners:
        t.start()
    try:
        for i in range(4):
            with ThreadPoolExecutor(max_workers=1) as pool:  # the thread exits when the pool closes
                server = pool.submit(RedisServer(port=free_port(), data_dir=tmp_path / str(i)).start).result()
            servers.append(server)
            time.sleep(0.5)  # a death signal from the exited thread would have stopped it by now
            assert server.process is not None and server.process.poll() is None
            client = redis.Redis.from_url(server.url, socket_timeout=5)
            assert client.ping()
            client.close()
            server.stop()
    finally:
        stop.set()
        for t in burners:
            t.join()
        for s in servers:
            s.stop()
