"""Helpers to run real servers as subprocesses on loopback for the suite."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from semserve.ports import free_port as free_port  # the tests take it from here

ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """A `semserve ...` subprocess with its log in a file, stopped with SIGTERM."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "semserve", *self.args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if ready():
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{what} not ready after {timeout_s}s:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def http_ready(url: str) -> Callable[[], bool]:
    def check() -> bool:
        return httpx.get(url, timeout=2).status_code == 200

    return check


def metric_value(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


class TcpProxy:
    """A loopback TCP proxy that can be cut and restored: the predictor "dies" for the transformer
    without disturbing the predictor process other tests share."""

    def __init__(self, target_port: int, listen_port: int | None = None) -> None:
        import threading

        self.target_port = target_port
        self.port = listen_port or free_port()
        self._threading = threading
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        self._threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if self._hold(client):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self._threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _hold(self, client: socket.socket) -> bool:
        """Keep a new connection from the target (True), or let it through (False)."""
        return False

    def _forward(self, data: bytes, dst: socket.socket) -> None:
        dst.sendall(data)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._forward(data, dst)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Refuse new connections and cut the open ones, like a dead pod."""
        if self._listener is not None:
            # close() alone does not wake a thread blocked in accept(), which would keep accepting.
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()


class FaultProxy(TcpProxy):
    """A TcpProxy with more faults, each switchable while connections are open:

    - `latency_s`: added before every chunk forwarded, both directions (a slow link or a slow
      server: 0.05 makes each Redis round trip cost at least 100 ms);
    - `blackhole`: connections are accepted but nothing is forwarded, either way (new connections
      are held open and their bytes dropped; open ones stop passing data): a peer that hangs;
    - `stop()` / `start()` (from TcpProxy): cut everything and refuse, then serve again.
    """

    def __init__(self, target_port: int, listen_port: int | None = None, latency_s: float = 0.0) -> None:
        super().__init__(target_port, listen_port)
        self.latency_s = latency_s
        self.blackhole = False

    def clear(self) -> None:
        """No added latency, no black hole."""
        self.latency_s = 0.0
        self.blackhole = False

    def _hold(self, client: socket.socket) -> bool:
        if not self.blackhole:
            return False
        with self._lock:
            self._conns.append(client)
        self._threading.Thread(target=self._drain, args=(client,), daemon=True).start()
        return True

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def _forward(self, data: bytes, dst: socket.socket) -> None:
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        if not self.blackhole:
            dst.sendall(data)


def last_engine_start_lines(log: Path) -> list[str]:
    """A predictor log's lines from its last engine start (its `engine_compile_cache` line) on;
    the whole log when it has none. Logs are appended to across restarts."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, x in enumerate(lines) if '"engine_compile_cache"' in x]
    return lines[starts[-1]:] if starts else lines
