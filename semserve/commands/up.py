"""`semserve up` (= `make run`): the local stack in the foreground, stopped cleanly with Ctrl-C.

Each server is a child process with its log under .cache/logs/; we wait until each is ready,
print the endpoints and a request that works, and on Ctrl-C (or SIGTERM) stop them in reverse order.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

LOG_DIR = Path(".cache/logs")


@dataclass
class Component:
    name: str
    args: list[str]
    ports: list[int]
    ready_url: str


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("up", help="run the local stack (what `make run` does)")
    parser.add_argument("--redis-port", type=int, default=6380)
    parser.add_argument("--predictor-http-port", type=int, default=8090)
    parser.add_argument("--predictor-grpc-port", type=int, default=8091)
    parser.add_argument("--transformer-http-port", type=int, default=8080)
    parser.add_argument("--transformer-grpc-port", type=int, default=8081)
    parser.add_argument("--ready-timeout-s", type=float, default=600)
    parser.set_defaults(func=_up)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _ready(url: str) -> bool:
    if url.startswith("redis:"):
        port = int(url.rsplit(":", 1)[1])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _components(args: argparse.Namespace) -> list[Component]:
    data_dir = Path(".cache/redis")
    return [
        Component(
            "redis",
            ["--redis-server", "--port", str(args.redis_port), "--data-dir", str(data_dir)],
            [args.redis_port],
            f"redis:{args.redis_port}",
        ),
        Component(
            "predictor",
            [
                "predictor",
                "--http-port", str(args.predictor_http_port),
                "--grpc-port", str(args.predictor_grpc_port),
            ],
            [args.predictor_http_port, args.predictor_grpc_port],
            f"http://127.0.0.1:{args.predictor_http_port}/v2/health/ready",
        ),
        Component(
            "transformer",
            [
                "transformer",
                "--http-port", str(args.transformer_http_port),
                "--grpc-port", str(args.transformer_grpc_port),
                "--predictor-host", f"127.0.0.1:{args.predictor_grpc_port}",
                "--predictor-url", f"http://127.0.0.1:{args.predictor_http_port}",
                "--cache-redis-url", f"redis://127.0.0.1:{args.redis_port}/0",
            ],
            [args.transformer_http_port, args.transformer_grpc_port],
            f"http://127.0.0.1:{args.transformer_http_port}/v2/health/ready",
        ),
    ]


def _up(args: argparse.Namespace) -> int:
    components = _components(args)
    for comp in components:
        for port in comp.ports:
            if not _port_free(port):
                print(f"semserve up: port {port} ({comp.name}) is already in use", file=sys.stderr)
                return 1
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[Component, subprocess.Popen[bytes]]] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        for comp in components:
            log_path = LOG_DIR / f"{comp.name}.log"
            print(f"==> starting {comp.name} (log: {log_path})", flush=True)
            log = log_path.open("ab")
            # Redis runs from the cache package's launcher; the services are semserve subcommands.
            argv = (
                [sys.executable, "-m", "cache.redis_server", *comp.args[1:]]
                if comp.args[0] == "--redis-server"
                else [sys.executable, "-m", "semserve", *comp.args]
            )
            proc = subprocess.Popen(
                argv,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            procs.append((comp, proc))
            started = time.monotonic()
            while not _ready(comp.ready_url):
                if stopping:
                    return 0
                if proc.poll() is not None:
                    print(f"{comp.name} exited with {proc.returncode}; see {log_path}", file=sys.stderr)
                    return 1
                if time.monotonic() - started > args.ready_timeout_s:
                    print(f"{comp.name} not ready after {args.ready_timeout_s}s; see {log_path}",
                          file=sys.stderr)
                    return 1
                print(f"    waiting for {comp.name}... {time.monotonic() - started:.0f}s", end="\r",
                      flush=True)
                time.sleep(1)
            print(f"    {comp.name} ready in {time.monotonic() - started:.0f}s          ", flush=True)
        http = args.transformer_http_port
        body = (
            '{"model":"llm","temperature":0,'
            '"messages":[{"role":"user","content":"What is the capital of France?"}]}'
        )
        print(
            f"""
semserve is up.
  transformer  v2 REST + OpenAI  http://127.0.0.1:{http}    v2 gRPC 127.0.0.1:{args.transformer_grpc_port}
  predictor    v2 REST + OpenAI  http://127.0.0.1:{args.predictor_http_port}    \
v2 gRPC 127.0.0.1:{args.predictor_grpc_port}
  redis        redis://127.0.0.1:{args.redis_port}
  logs         {LOG_DIR}/

Try (twice: the second answer comes from the cache, see x-semserve-cache):
  curl -si http://127.0.0.1:{http}/openai/v1/chat/completions \\
    -H 'content-type: application/json' -d '{body}'

Ctrl-C stops everything.""",
            flush=True,
        )
        while not stopping:
            for comp, proc in procs:
                if proc.poll() is not None:
                    print(f"{comp.name} exited with {proc.returncode}; stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        for comp, proc in reversed(procs):
            if proc.poll() is None:
                print(f"==> stopping {comp.name}", flush=True)
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(procs):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
