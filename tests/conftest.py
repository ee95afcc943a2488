"""Suite-wide fixtures: one real predictor (vLLM on the prepared SmolLM2) shared by every test."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT, ServerProcess, free_port, http_ready

LOG_DIR = ROOT / ".cache" / "test-logs"
# The model revision the shared predictor labels its answers with.
PREDICTOR_REVISION = "rev-a"

# Llama/SmolLM chat format: tests that use v2 send already-templated prompts, like Triton clients do.
FRANCE = (
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


@dataclass
class Predictor:
    http: str
    grpc: str
    process: ServerProcess

    @property
    def openai_base(self) -> str:
        return f"{self.http}/openai/v1"


def _needs_predictor(item: pytest.Item) -> bool:
    return "predictor" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that need no shared predictor run first, while it starts (pytest_collection_finish):
    # its first start compiles for minutes, and those tests leave a core free most of the time.
    # Tests that kill and restart the shared predictor run after everything else that uses it, and
    # those that stop it for good run last.
    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("stops_predictor"):
            return 3
        if item.get_closest_marker("restarts_predictor"):
            return 2
        return 1 if _needs_predictor(item) else 0

    items.sort(key=order)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or _running_predictor() is not None:
        return
    if any(_needs_predictor(item) for item in session.items):
        _SUITE.launch()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A launch no test came to use (all of them deselected or failed early) is stopped here too.
    _SUITE.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stops_predictor: ends the shared predictor process")
    config.addinivalue_line(
        "markers", "restarts_predictor: kills the shared predictor and starts it again (same ports)"
    )


class _RunningPredictor(ServerProcess):
    """A predictor this session did not start (SEMSERVE_TEST_PREDICTOR): never stopped by it."""

    def stop(self, timeout_s: float = 60) -> int | None:
        return None


def _running_predictor() -> Predictor | None:
    # Development only: several pytest runs on this 2-core machine share one predictor that is
    # already up, "http://127.0.0.1:P,127.0.0.1:G[,log path]". Tests that stop or restart the
    # predictor must be deselected then (-m "not stops_predictor and not restarts_predictor").
    spec = os.environ.get("SEMSERVE_TEST_PREDICTOR")
    if not spec:
        return None
    http, grpc, *log = spec.split(",")
    proc = _RunningPredictor([], Path(log[0]) if log else LOG_DIR / "predictor.log")
    return Predictor(http, grpc, proc)


class _SuitePredictor:
    """The shared predictor's process, launched once collection shows a test needs it, and a thread
    that polls its readiness twice a second from then on (tests/semserve/test_quiet_logs.py reads
    the 503s those polls get while the engine loads)."""

    def __init__(self) -> None:
        self.shared: Predictor | None = None
        self._ready: threading.Thread | None = None
        self._failure: BaseException | None = None

    def launch(self) -> None:
        if self.shared is not None:
            return
        http_port, grpc_port = free_port(), free_port()
        proc = ServerProcess(
            [
                "predictor",
                "--http-port", str(http_port),
                "--grpc-port", str(grpc_port),
                "--max-body-bytes", str(256 * 1024),
                "--grace-period-s", "60",
                # Spans kept in process and readable at /debug/spans (tests/semserve/test_tracing.py).
                # Ratio 0: only requests whose caller sampled a trace record, so other tests pay nothing.
                "--trace-exporter", "memory", "--trace-sample-ratio", "0",
                # Reported with every answer (tests/predictors/test_model_revision.py); transformers
                # without a --model-revision of their own cache it as before.
                "--model-revision", PREDICTOR_REVISION,
            ],
            LOG_DIR / "predictor.log",
        ).start()
        self.shared = Predictor(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", proc)
        self._ready = threading.Thread(target=self._wait_ready, name="suite-predictor-ready", daemon=True)
        self._ready.start()

    def _wait_ready(self) -> None:
        assert self.shared is not None
        try:
            # From the launch: the first start compiles, beside the tests that run meanwhile.
            self.shared.process.wait_until(http_ready(f"{self.shared.http}/v2/health/ready"), 900,
                                           "predictor")  # fmt: skip
        except BaseException as exc:  # raised in the test that asks for the predictor
            self._failure = exc

    def ready(self) -> Predictor:
        self.launch()
        assert self.shared is not None and self._ready is not None
        self._ready.join()
        if self._failure is not None:
            raise self._failure
        return self.shared

    def stop(self) -> None:
        # The process of now: a restarts_predictor test may have replaced the first one.
        if self.shared is not None:
            self.shared.process.stop()
            self.shared = None


_SUITE = _SuitePredictor()


@pytest.fixture(scope="session")
def predictor() -> Iterator[Predictor]:
    running = _running_predictor()
    if running is not None:
        yield running
        return
    try:
        yield _SUITE.ready()
    finally:
        _SUITE.stop()


@dataclass
class Transformer:
    http: str
    grpc: str
    process: ServerProcess

    @property
    def openai_base(self) -> str:
        return f"{self.http}/openai/v1"


def start_transformer(
    name: str,
    predictor_grpc: str,
    redis_url: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Transformer:
    http_port, grpc_port = free_port(), free_port()
    proc = ServerProcess(
        [
            "transformer",
            "--http-port", str(http_port),
            "--grpc-port", str(grpc_port),
            # Only the predictor's gRPC port, as in Knative mode: every miss goes over it.
            "--predictor-host", predictor_grpc,
            "--cache-redis-url", redis_url,
            # Each transformer of the suite gets its own index, so tests never see each other.
            "--cache-deployment", name,
            "--grace-period-s", "5",
            *extra,
        ],
        LOG_DIR / f"transformer-{name}.log",
        env=env,
    ).start()
    url = f"http://127.0.0.1:{http_port}"
    proc.wait_until(http_ready(f"{url}/v2/health/ready"), 180, f"transformer {name}")
    return Transformer(url, f"127.0.0.1:{grpc_port}", proc)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    from semserve.tooling.local_redis import RedisServer

    server = RedisServer(free_port(), data_dir=LOG_DIR / "redis-suite").start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def transformer(predictor: Predictor, redis_url: str) -> Iterator[Transformer]:
    t = start_transformer("main", predictor.grpc, redis_url, "--log-level", "debug")
    try:
        yield t
    finally:
        t.process.stop()


@pytest.fixture(scope="session")
def log_dir() -> Path:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    return LOG_DIR
