"""The stack `semserve bench soak` starts when it is given no running one: Redis with RediSearch,
the predictor (log level info: its generations are what answers are checked against) and one
transformer, or N replicas behind nginx, with an API keys file; all on free ports."""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.predictor import _free_port
from bench.procs import LOG_DIR, Proc, wait_http
from bench.soak_client import Endpoint


@dataclass
class LocalStack:
    """What was started, so that `stop` ends it all, also after a start that failed half way."""

    procs: list[Proc] = field(default_factory=list)
    redis: object | None = None  # semserve.tooling.local_redis.RedisServer
    lb: object | None = None  # semserve.loadbalancer.LoadBalancer
    endpoint: Endpoint | None = None
    predictor_log: Path | None = None
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key
    pids: dict[str, int] = field(default_factory=dict)  # server name -> pid, for the resource samples

    def start(self, model: str | None, tenants: int, concurrency: int, transformers: int) -> LocalStack:
        from semserve import model_prep
        from semserve.loadbalancer import Backend, Frontend, LoadBalancer
        from semserve.tooling.local_redis import RedisServer
        from transformers_svc.auth import hash_key

        LOG_DIR.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="soak-", dir=LOG_DIR))
        keys = {f"tenant{i}": f"soak-key-{i}-{random.randrange(10**9)}" for i in range(tenants)}
        self.keys = keys
        (work / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
        redis = RedisServer(_free_port(), data_dir=work / "redis").start()
        self.redis = redis
        p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
        predictor_log = LOG_DIR / "soak-predictor.log"
        self.predictor_log = predictor_log
        model_dir = Path(model) if model else model_prep.prepare().model_dir
        pred = Proc(
            "predictor",
            ["predictor", "--model", str(model_dir), "--http-port", str(p_http),
             "--grpc-port", str(p_grpc), "--max-num-seqs", str(max(32, concurrency)),
             # Info: its `generation_finished` lines are what every answer is checked against.
             "--max-model-len", "2048", "--log-level", "info"],
            f"http://127.0.0.1:{p_http}/v2/health/ready", predictor_log,
        )
        self.procs.append(pred.start())
        pred.wait_ready()
        # One transformer on t_http/t_grpc, or N replicas behind nginx there.
        n = max(1, transformers)
        ports = [(t_http, t_grpc)] if n == 1 else [(_free_port(), _free_port()) for _ in range(n)]
        replicas = [
            Proc(
                "transformer" if n == 1 else f"transformer-{i}",
                ["transformer", "--http-port", str(http), "--grpc-port", str(grpc),
                 "--predictor-host", f"127.0.0.1:{p_grpc}",
                 "--cache-redis-url", redis.url, "--cache-deployment", "soak",
                 "--api-keys-file", str(work / "keys.json"), "--log-level", "warning"],
                f"http://127.0.0.1:{http}/v2/health/ready",
                LOG_DIR / ("soak-transformer.log" if n == 1 else f"soak-transformer-{i}.log"),
            )
            for i, (http, grpc) in enumerate(ports)
        ]
        for proc in replicas:  # all at once, as pods of one deployment start
            self.procs.append(proc.start())
        for proc in replicas:
            proc.wait_ready(300)
        if n > 1:
            self.lb = LoadBalancer(Frontend(t_http, t_grpc, work / "nginx"),
                                   [Backend(http, grpc) for http, grpc in ports]).start()
            wait_http(f"http://127.0.0.1:{t_http}/v2/health/ready", 30)
        self.endpoint = Endpoint(f"http://127.0.0.1:{t_http}", f"127.0.0.1:{t_grpc}")
        assert pred.proc is not None and redis.process is not None
        self.pids = {"predictor": pred.proc.pid, "redis": redis.process.pid}
        self.pids.update({p.name: p.proc.pid for p in replicas if p.proc is not None})
        return self

    def stop(self) -> None:
        if self.lb is not None:
            self.lb.stop()  # type: ignore[attr-defined]
        for proc in reversed(self.procs):
            proc.stop()
        if self.redis is not None:
            self.redis.stop()  # type: ignore[attr-defined]
