"""`semserve up` (= `make run`): the local stack in the foreground, stopped cleanly with Ctrl-C.

Each server is a child process with its log under .cache/logs/. All start at once (the transformer
answers cache hits while the predictor's engine still loads); a child that exits later is restarted
with a back-off while the others keep serving, as Kubernetes does with containers. Only Ctrl-C or
SIGTERM stops everything (in reverse order). `up.json` beside the logs holds each component's state,
pid and restart count.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

from semserve import loadbalancer
from semserve.loadbalancer import Backend, Frontend
from semserve.supervise import (
    Component,
    StackRunning,
    StartFailed,
    Supervisor,
    read_status,
    stop_leftovers,
)

COMPONENTS = ("redis", "predictor", "transformer")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "up",
        help="run the local stack (what `make run` does)",
        description="Run Redis, the predictor and the transformer in the foreground; Ctrl-C stops them. "
        "A component that exits after it was ready is restarted (with back-off) while the others "
        "keep serving.",
    )
    parser.add_argument("--redis-port", type=int, default=6380, help="Redis port (default %(default)s)")
    parser.add_argument(
        "--predictor-http-port", type=int, default=8090,
        help="predictor HTTP port: v2 REST, OpenAI, /metrics (default %(default)s)",
    )
    parser.add_argument(
        "--predictor-grpc-port", type=int, default=8091,
        help="predictor gRPC port, the one the transformer sends misses to (default %(default)s)",
    )
    parser.add_argument(
        "--transformer-http-port", type=int, default=8080,
        help="transformer HTTP port: v2 REST, OpenAI, admin, /metrics (default %(default)s)",
    )
    parser.add_argument(
        "--transformer-grpc-port", type=int, default=8081,
        help="transformer gRPC port (default %(default)s)",
    )
    parser.add_argument(
        "--transformers", type=int, default=1, metavar="N",
        help="transformer replicas (default %(default)s); more than one run behind nginx (round robin, "
        "HTTP and gRPC) on the transformer ports above, as replicas run behind a Service in prod",
    )
    parser.add_argument(
        "--replica-base-port", type=int, default=8100,
        help="with --transformers N > 1: replica i (from 0) listens on HTTP base+2i and gRPC "
        "base+2i+1 (default %(default)s)",
    )
    parser.add_argument(
        "--ready-timeout-s", type=float, default=600,
        help="give up when a component is not ready this long after its first start (default %(default)s)",
    )
    parser.add_argument(
        "--without", action="append", default=[], choices=COMPONENTS, metavar="COMPONENT",
        help="leave a component out (repeatable), e.g. --without predictor to run the transformer "
        "against a predictor you started yourself on --predictor-grpc-port",
    )
    parser.add_argument(
        "--log-dir", type=Path, default=Path(".cache/logs"),
        help="where each component's log and up.json go (default %(default)s)",
    )
    parser.add_argument(
        "--redis-data-dir", type=Path, default=Path(".cache/redis"),
        help="Redis data directory: its append-only file and log (default %(default)s)",
    )
    parser.add_argument(
        "--redis-persistence", choices=("aof", "none"), default="aof",
        help="aof: the cache survives a restart of Redis or of the stack (append-only file in "
        "--redis-data-dir, fsync every second); none: in memory only (default %(default)s)",
    )
    parser.add_argument(
        "--status", action="store_true",
        help="print each component's state from up.json in --log-dir and exit (a stack whose "
        "`semserve up` is gone shows as stopped)",
    )
    parser.set_defaults(func=_up)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind the port now. SO_REUSEADDR as the servers themselves bind (uvicorn,
    gRPC, Redis): a socket of a stopped run lingering in TIME_WAIT does not stop them, so it must
    not stop us either."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _redis_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def components(args: argparse.Namespace) -> list[Component]:
    py = sys.executable
    every = [
        Component(
            "redis",
            [py, "-m", "semserve.tooling.local_redis", "--port", str(args.redis_port),
             "--data-dir", str(args.redis_data_dir),
             *(["--appendonly"] if args.redis_persistence == "aof" else [])],
            [args.redis_port],
            lambda: _redis_ready(args.redis_port),
        ),
        Component(
            "predictor",
            [py, "-m", "semserve", "predictor",
             "--http-port", str(args.predictor_http_port),
             "--grpc-port", str(args.predictor_grpc_port)],
            [args.predictor_http_port, args.predictor_grpc_port],
            lambda: _http_ready(f"http://127.0.0.1:{args.predictor_http_port}/v2/health/ready"),
        ),
        *_transformers(args),
    ]  # fmt: skip
    return [c for c in every if c.name not in args.without]


def replica_backends(args: argparse.Namespace) -> list[Backend]:
    """The ports of each transformer replica: the usual ones for a single transformer; behind the
    load balancer, consecutive pairs from --replica-base-port."""
    if args.transformers <= 1:
        return [Backend(args.transformer_http_port, args.transformer_grpc_port)]
    base = args.replica_base_port
    return [Backend(base + 2 * i, base + 2 * i + 1) for i in range(args.transformers)]


def _transformers(args: argparse.Namespace) -> list[Component]:
    if "transformer" in args.without:
        return []
    py = sys.executable
    backends = replica_backends(args)
    replicas = [
        Component(
            "transformer" if len(backends) == 1 else f"transformer-{i}",
            [py, "-m", "semserve", "transformer",
             "--http-port", str(b.http_port),
             "--grpc-port", str(b.grpc_port),
             "--predictor-host", f"127.0.0.1:{args.predictor_grpc_port}",
             "--cache-redis-url", f"redis://127.0.0.1:{args.redis_port}/0"],
            [b.http_port, b.grpc_port],
            # Default arguments bind this replica's port, not the loop's last one.
            lambda port=b.http_port: _http_ready(f"http://127.0.0.1:{port}/v2/health/ready"),
        )
        for i, b in enumerate(backends)
    ]  # fmt: skip
    if len(backends) == 1:
        return replicas
    front = Frontend(args.transformer_http_port, args.transformer_grpc_port, args.log_dir / "nginx")
    argv = loadbalancer.prepare(front, backends)
    lb = Component(
        "loadbalancer",
        argv,
        [front.http_port, front.grpc_port],
        # Ready once it answers for a ready replica; a replica that is not ready yet answers 503.
        lambda: _http_ready(f"http://127.0.0.1:{front.http_port}/v2/health/live"),
    )
    return [*replicas, lb]


def _banner(args: argparse.Namespace, sup: Supervisor) -> str:
    http = args.transformer_http_port
    # A system prompt of our own: without one the model's template adds a default that makes this
    # small model wander (README, "Try it").
    body = (
        '{"model":"llm","temperature":0,"max_tokens":32,"messages":['
        '{"role":"system","content":"You answer in one short sentence."},'
        '{"role":"user","content":"What is the capital of France?"}]}'
    )
    # Only what runs here (a component left out with --without is not announced as up).
    lines = []
    if "transformer" not in args.without:
        lines.append(f"  transformer  v2 REST + OpenAI  http://127.0.0.1:{http}    "
                     f"v2 gRPC 127.0.0.1:{args.transformer_grpc_port}{_replicas_line(args)}")  # fmt: skip
    if "predictor" not in args.without:
        lines.append(f"  predictor    v2 REST + OpenAI  http://127.0.0.1:{args.predictor_http_port}    "
                     f"v2 gRPC 127.0.0.1:{args.predictor_grpc_port}")  # fmt: skip
    else:
        lines.append(f"  predictor    started elsewhere: v2 gRPC 127.0.0.1:{args.predictor_grpc_port}")
    if "redis" not in args.without:
        lines.append(f"  redis        redis://127.0.0.1:{args.redis_port}")
    try_it = "" if "transformer" in args.without else f"""
Try (twice: the second answer comes from the cache, see x-semserve-cache):
  curl -si http://127.0.0.1:{http}/openai/v1/chat/completions \\
    -H 'content-type: application/json' -d '{body}'
"""
    endpoints = "\n".join(lines)
    return f"""
semserve is up.
{endpoints}
  logs         {args.log_dir}/   (state and restart counts: {sup.status_path})
  {_status_line(sup)}
{try_it}
A component that exits is restarted; Ctrl-C stops everything.{_persistence_line(args)}"""


def _persistence_line(args: argparse.Namespace) -> str:
    if args.redis_persistence == "none" or "redis" in args.without:
        return ""
    return (
        f"\nThe cache persists in {args.redis_data_dir}/ (entries stored more than a second before survive a "
        "restart; --redis-persistence none keeps it in memory only)."
    )


def _replicas_line(args: argparse.Namespace) -> str:
    if args.transformers <= 1:
        return ""
    ports = ", ".join(str(b.http_port) for b in replica_backends(args))
    return (
        f"\n               ({args.transformers} replicas behind nginx, round robin; "
        f"replica HTTP ports {ports})"
    )


def _status_line(sup: Supervisor) -> str:
    parts = []
    for st in sup.statuses():
        restarts = f", {st.restarts} restart{'s' if st.restarts != 1 else ''}" if st.restarts else ""
        parts.append(f"{st.name} {st.state}{restarts}")
    return "status: " + "; ".join(parts)


def _print_status(args: argparse.Namespace) -> int:
    statuses = read_status(args.log_dir / "up.json")
    if not statuses:
        print(f"semserve up: no stack recorded in {args.log_dir / 'up.json'}")
        return 1
    for st in statuses:
        pid = f" (pid {st.pid})" if st.pid else ""
        print(f"{st.name}: {st.state}{pid}, {st.restarts} restarts")
    return 0


def _up(args: argparse.Namespace) -> int:
    if args.status:
        return _print_status(args)
    if args.transformers < 1:
        print("semserve up: --transformers must be at least 1", file=sys.stderr)
        return 2
    try:
        comps = components(args)
    except loadbalancer.NginxMissing as exc:
        print(f"semserve up: --transformers {args.transformers} needs a load balancer: {exc}",
              file=sys.stderr)
        return 1
    try:
        # Before the port check: what a dead `semserve up` left holds our ports.
        stop_leftovers(args.log_dir / "up.json", say=lambda m: print(m, flush=True))
    except StackRunning as exc:
        print(f"semserve up: {exc}", file=sys.stderr)
        return 1
    for comp in comps:
        for port in comp.ports:
            if not port_free(port):
                print(f"semserve up: port {port} ({comp.name}) is already in use", file=sys.stderr)
                return 1
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # A closed terminal (an SSH session that drops): the children are in sessions of their own,
    # so the hangup reaches only us; stop them as for Ctrl-C.
    signal.signal(signal.SIGHUP, stop)
    sup = Supervisor(comps, args.log_dir, args.ready_timeout_s, say=lambda m: print(m, flush=True))
    announced = False
    last_status = ""
    try:
        sup.start_all()
        while not stopping:
            all_ready = sup.poll()
            if all_ready and not announced:
                print(_banner(args, sup), flush=True)
                announced = True
                last_status = _status_line(sup)
            elif announced:
                # After a restart: one line with every component's state and restart count.
                line = _status_line(sup)
                if line != last_status and all_ready:
                    print(line, flush=True)
                last_status = line if all_ready else last_status
            time.sleep(0.5)
        return 0
    except StartFailed as exc:
        print(f"semserve up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        sup.stop_all()
