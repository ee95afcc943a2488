"""A real load balancer in front of transformer replicas: Debian's nginx, round robin, HTTP and gRPC.

Prod runs several transformer replicas behind a Kubernetes Service; `semserve up --transformers N`
and the replica tests put nginx in that place, so requests of one burst land on different replicas
as they do there. nginx runs unprivileged in the foreground with everything (config, pid, logs,
temp files) in one directory:

    nginx -p DIR -c DIR/nginx.conf -g 'daemon off;'

HTTP is proxied unbuffered (server-sent events stream through as they are produced); gRPC goes over
HTTP/2 (`grpc_pass`), streams included.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

# Generations take a while (a cold CPU predictor, long answers): the proxy must not time them out.
READ_TIMEOUT_S = 600


class NginxMissing(RuntimeError):
    """No nginx binary: `make test` installs Debian's (apt-get install nginx)."""


@dataclass(frozen=True)
class Backend:
    """One transformer replica's ports on loopback."""

    http_port: int
    grpc_port: int


@dataclass(frozen=True)
class Frontend:
    """What the load balancer listens on, and where its files go."""

    http_port: int
    grpc_port: int
    workdir: Path
    host: str = "127.0.0.1"


def nginx_binary() -> str:
    found = os.environ.get("SEMSERVE_NGINX") or shutil.which("nginx") or _sbin("nginx")
    if not found:
        raise NginxMissing("nginx is not installed (Debian: apt-get install nginx; `make test` does it)")
    return found


def _sbin(name: str) -> str | None:
    path = Path("/usr/sbin") / name
    return str(path) if path.exists() else None


def render_config(front: Frontend, backends: list[Backend]) -> str:
    if not backends:
        raise ValueError("a load balancer needs at least one backend")
    d = front.workdir.resolve()
    # As root nginx would hand its workers to `nobody`, who cannot write our temp directory.
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    http_servers = "".join(f"    server 127.0.0.1:{b.http_port};\n" for b in backends)
    grpc_servers = "".join(f"    server 127.0.0.1:{b.grpc_port};\n" for b in backends)
    temp = "".join(
        f"  {kind}_temp_path {d / 'tmp' / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""# Rendered by semserve.loadbalancer; nginx -p {d} -c {d / 'nginx.conf'}
{user}worker_processes 1;
pid {d / 'nginx.pid'};
error_log {d / 'error.log'} warn;
events {{
  worker_connections 4096;
}}
http {{
  access_log off;
{temp}  client_max_body_size 0;  # the transformer enforces its own limit, with a proper error
  upstream transformer_http {{
{http_servers}    keepalive 64;
  }}
  upstream transformer_grpc {{
{grpc_servers}  }}
  server {{
    listen {front.host}:{front.http_port} reuseport;
    location / {{
      proxy_pass http://transformer_http;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_buffering off;  # server-sent events pass through as they come
      proxy_request_buffering off;
      proxy_read_timeout {READ_TIMEOUT_S}s;
      proxy_send_timeout {READ_TIMEOUT_S}s;
    }}
  }}
  server {{
    listen {front.host}:{front.grpc_port} http2 reuseport;
    location / {{
      grpc_pass grpc://transformer_grpc;
      grpc_read_timeout {READ_TIMEOUT_S}s;
      grpc_send_timeout {READ_TIMEOUT_S}s;
    }}
  }}
}}
"""


def prepare(front: Frontend, backends: list[Backend]) -> list[str]:
    """Write the config (and the directories nginx needs) and return the command that runs it."""
    d = front.workdir.resolve()
    for sub in ("tmp/client_body", "tmp/proxy", "tmp/fastcgi", "tmp/uwsgi", "tmp/scgi", "logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    conf = d / "nginx.conf"
    conf.write_text(render_config(front, backends))
    return [nginx_binary(), "-p", str(d), "-c", str(conf), "-g", "daemon off;"]


def check(argv: list[str]) -> None:
    """`nginx -t` on the config: a clear error at start rather than a process that exits."""
    out = subprocess.run([*argv[:-2], "-t"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"nginx rejected its config:\n{out.stderr}")


@dataclass
class LoadBalancer:
    """nginx as a child process (tests, benchmarks); `semserve up` runs the same argv supervised."""

    front: Frontend
    backends: list[Backend]
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def http_url(self) -> str:
        return f"http://{self.front.host}:{self.front.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.front.host}:{self.front.grpc_port}"

    def start(self) -> LoadBalancer:
        argv = prepare(self.front, self.backends)
        check(argv)
        log = (self.front.workdir / "nginx.out").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def stop(self, timeout_s: float = 10) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # nginx: fast shutdown
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
