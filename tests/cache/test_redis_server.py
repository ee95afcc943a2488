"""The local Redis launcher."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cache.redis_server import PortInUseError, RedisServer, free_port


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
        [sys.executable, "-m", "cache.redis_server", "--port", str(port), "--data-dir", str(tmp_path)],
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
