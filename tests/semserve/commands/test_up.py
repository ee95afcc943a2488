"""`semserve up`: free-port check, all components started at once, a component that exits is
restarted while the others keep serving, and only SIGTERM/Ctrl-C stops everything."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from semserve.commands.up import components, port_free, register
from semserve.loadbalancer import NginxMissing, nginx_binary
from semserve.supervise import Component, StartFailed, Supervisor
from tests.conftest import Predictor
from tests.support import ROOT, free_port


def _time_wait_port() -> int:
    """A port whose only trace is a socket in TIME_WAIT (the side that closes first keeps it), left
    by a server that, like uvicorn, gRPC and Redis, listened with SO_REUSEADDR (Linux lets a new
    bind pass a TIME_WAIT socket only when both set it)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = int(server.getsockname()[1])
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end of the connection enters TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    time.sleep(0.1)  # the last FIN crosses loopback
    return port


def test_port_in_time_wait_is_free() -> None:
    port = _time_wait_port()
    out = subprocess.run(["ss", "-tan", f"sport = :{port}"], capture_output=True, text=True)
    if out.returncode == 0:  # iproute2 present: make sure the setup really left TIME_WAIT behind
        assert "TIME-WAIT" in out.stdout
    assert port_free(port)


def test_listening_port_is_not_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not port_free(int(s.getsockname()[1]))


def _sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(600)"]


def test_components_start_at_once(tmp_path: Path) -> None:
    """A slow component (the predictor's engine load) does not hold back the others."""
    marker = tmp_path / "fast-ready"
    fast = Component(
        "fast",
        [sys.executable, "-c", f"open({str(marker)!r}, 'w').close(); import time; time.sleep(600)"],
        [],
        marker.exists,
    )
    slow = Component("slow", _sleeper(), [], lambda: False)
    sup = Supervisor([slow, fast], tmp_path, ready_timeout_s=30, say=lambda _m: None)
    try:
        sup.start_all()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            sup.poll()
            if sup.waiting_for() == ["slow"]:
                break
            time.sleep(0.1)
        assert sup.waiting_for() == ["slow"]
        states = {c["name"]: c["state"] for c in json.loads(sup.status_path.read_text())["components"]}
        assert states == {"slow": "starting", "fast": "ready"}
    finally:
        sup.stop_all(grace_s=5)


def test_exit_before_ready_is_a_start_failure(tmp_path: Path) -> None:
    bad = Component("bad", [sys.executable, "-c", "raise SystemExit(3)"], [], lambda: False)
    sup = Supervisor([bad], tmp_path, ready_timeout_s=30, say=lambda _m: None)
    try:
        sup.start_all()
        with pytest.raises(StartFailed, match="bad exited with 3 before it was ready"):
            for _ in range(100):
                sup.poll()
                time.sleep(0.1)
    finally:
        sup.stop_all(grace_s=5)


def _status(log_dir: Path) -> dict[str, dict]:
    try:
        data = json.loads((log_dir / "up.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {c["name"]: c for c in data["components"]}


def _wait(what: str, cond, timeout_s: float, up: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert up.poll() is None, f"semserve up exited with {up.returncode}:\n{log.read_text()}"
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"{what} not within {timeout_s}s:\n{log.read_text()[-3000:]}")


CHAT = {
    "model": "llm",
    "temperature": 0,
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "Name a primary colour."}],
}


def _start_up(
    predictor: Predictor, tmp_path: Path, *extra: str
) -> tuple[subprocess.Popen[bytes], str, Path, Path]:
    """`semserve up` without its own predictor, on free ports; returns the process, the transformer's
    base URL, the log dir (up.json) and the file its output goes to."""
    log_dir, out_path = tmp_path / "logs", tmp_path / "up.out"
    http, grpc, redis_port = free_port(), free_port(), free_port()
    argv = [
        sys.executable, "-m", "semserve", "up", "--without", "predictor", *extra,
        # The suite's predictor stands in for the one `up` would start (one vLLM engine per suite).
        "--predictor-grpc-port", predictor.grpc.rsplit(":", 1)[1],
        "--transformer-http-port", str(http), "--transformer-grpc-port", str(grpc),
        "--redis-port", str(redis_port), "--log-dir", str(log_dir),
        "--redis-data-dir", str(tmp_path / "redis"),
    ]  # fmt: skip
    with out_path.open("wb") as out:
        up = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    return up, f"http://127.0.0.1:{http}", log_dir, out_path


def test_up_restarts_a_killed_redis_and_keeps_serving(predictor: Predictor, tmp_path: Path) -> None:
    """Redis SIGKILLed under `semserve up`: restarted with a log line and a restart count; the
    transformer never stops serving (it fails open, then caches again); SIGTERM stops all."""
    up, base, log_dir, out_path = _start_up(predictor, tmp_path, "--ready-timeout-s", "180")
    try:
        _wait("banner", lambda: "semserve is up." in out_path.read_text(), 240, up, out_path)
        first = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT, timeout=120)
        assert first.status_code == 200, first.text
        second = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT, timeout=60)
        assert second.headers["x-semserve-cache"] == "exact"

        launcher = psutil.Process(_status(log_dir)["redis"]["pid"])
        server = next(p for p in launcher.children(recursive=True) if "server" in p.name())
        server.send_signal(signal.SIGKILL)

        # The transformer keeps answering while Redis is gone (fail open) ...
        _wait("redis exit noticed", lambda: _status(log_dir)["redis"]["restarts"] == 1, 30, up, out_path)
        during = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT, timeout=60)
        assert during.status_code == 200, during.text
        # ... and Redis comes back by itself, with a log line and the count in up.json.
        _wait("redis ready again", lambda: _status(log_dir)["redis"]["state"] == "ready", 60, up, out_path)
        text = out_path.read_text()
        assert "redis exited with" in text and "restart 1" in text
        assert "redis ready again (restart 1)" in text
        # The status line follows up.json's update (same loop, a moment later): waited for, not raced.
        status = "status: redis ready, 1 restart; transformer ready"
        _wait("status line", lambda: status in out_path.read_text(), 30, up, out_path)
        assert _status(log_dir)["transformer"]["restarts"] == 0
        assert httpx.get(f"{base}/v2/health/ready", timeout=5).status_code == 200
        after = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT, timeout=60)
        assert after.status_code == 200, after.text
    finally:
        children = [p for p in psutil.Process(up.pid).children(recursive=True)] if up.poll() is None else []
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    assert code == 0, out_path.read_text()
    assert "==> stopping transformer" in out_path.read_text()
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {alive}"
    # Stopping `up` stopped only what it started: the predictor it was pointed at still serves.
    time.sleep(2)
    # (A predictor shared through SEMSERVE_TEST_PREDICTOR has no process object here: its health says.)
    assert predictor.process.proc is None or predictor.process.proc.poll() is None
    assert httpx.get(f"{predictor.http}/v2/health/ready", timeout=5).status_code == 200


def test_three_transformers_are_replicas_behind_the_load_balancer(tmp_path: Path) -> None:
    """--transformers 3: three replicas on their own ports and nginx on the usual transformer ports."""
    try:
        nginx = nginx_binary()
    except NginxMissing as exc:
        pytest.skip(str(exc))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["up", "--transformers", "3", "--replica-base-port", "9200", "--log-dir", str(tmp_path)]
    )
    comps = {c.name: c for c in components(args)}
    assert list(comps) == ["redis", "predictor", "transformer-0", "transformer-1", "transformer-2",
                           "loadbalancer"]  # fmt: skip
    assert [comps[f"transformer-{i}"].ports for i in range(3)] == [[9200, 9201], [9202, 9203], [9204, 9205]]
    assert comps["loadbalancer"].ports == [8080, 8081] and comps["loadbalancer"].argv[0] == nginx
    conf = (tmp_path / "nginx" / "nginx.conf").read_text()
    assert "server 127.0.0.1:9202;" in conf and "server 127.0.0.1:9205;" in conf


def test_up_runs_three_replicas_behind_nginx(predictor: Predictor, tmp_path: Path) -> None:
    """`semserve up --transformers 3`: the usual transformer port answers through nginx, the
    replicas share one cache, and SIGTERM stops nginx with the rest."""
    try:
        nginx_binary()
    except NginxMissing as exc:
        pytest.skip(str(exc))
    up, base, log_dir, out_path = _start_up(
        predictor, tmp_path, "--transformers", "3", "--replica-base-port", str(_free_pair_base(3)),
        "--ready-timeout-s", "240",
    )
    try:
        _wait("banner", lambda: "semserve is up." in out_path.read_text(), 300, up, out_path)
        assert "3 replicas behind nginx" in out_path.read_text()
        assert {n: c["state"] for n, c in _status(log_dir).items()} == {
            "redis": "ready", "transformer-0": "ready", "transformer-1": "ready",
            "transformer-2": "ready", "loadbalancer": "ready",
        }  # fmt: skip
        statuses = []
        for _ in range(3):
            r = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT, timeout=120)
            assert r.status_code == 200, r.text
            statuses.append(r.headers["x-semserve-cache"])
        assert statuses[1:] == ["exact", "exact"]  # other replicas, one cache
        children = list(psutil.Process(up.pid).children(recursive=True))
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(90)
    assert code == 0, out_path.read_text()
    assert "==> stopping loadbalancer" in out_path.read_text()
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {alive}"


def _free_pair_base(pairs: int) -> int:
    """A base port with 2*pairs free ports after it."""
    for _ in range(50):
        base = free_port()
        if base + 2 * pairs < 65535 and all(port_free(base + i) for i in range(2 * pairs)):
            return base
    raise RuntimeError("no run of free ports")
