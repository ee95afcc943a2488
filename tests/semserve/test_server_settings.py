"""ServerSettings: the fields both services have are declared once, each service keeps its own env
prefix and port defaults, and both build their server from those fields the same way."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from predictors.config import PredictorSettings
from semserve.config import ServerSettings
from semserve.serving import SemserveModelServer
from transformers_svc.config import TransformerSettings

SERVICES = (PredictorSettings, TransformerSettings)


def fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


@pytest.fixture(autouse=True)
def no_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in SERVICES:
        for f in dataclasses.fields(cls):
            monkeypatch.delenv(cls.env_name(f), raising=False)


def test_shared_fields_come_from_server_settings() -> None:
    shared = fields(ServerSettings)
    for cls in SERVICES:
        own = fields(cls)
        for name, base in shared.items():
            assert own[name].metadata["help"] == base.metadata["help"], f"{cls.__name__}.{name}"
    # Only ports differ, and only where the predictor sits beside a transformer.
    differing = {
        name for name in shared
        if fields(PredictorSettings)[name].default != fields(TransformerSettings)[name].default
    }
    assert differing == {"http_port", "grpc_port"}


def test_each_service_keeps_its_ports_and_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    p, t = PredictorSettings.from_env(), TransformerSettings.from_env()
    assert (p.http_port, p.grpc_port, t.http_port, t.grpc_port) == (8090, 8091, 8080, 8081)
    monkeypatch.setenv("SEMSERVE_TRANSFORMER_GRACE_PERIOD_S", "5")
    monkeypatch.setenv("SEMSERVE_PREDICTOR_MAX_BODY_BYTES", "1000")
    p, t = PredictorSettings.from_env(), TransformerSettings.from_env()
    assert (p.grace_period_s, t.grace_period_s) == (30.0, 5.0)
    assert (p.max_body_bytes, t.max_body_bytes) == (1000, 4 * 1024 * 1024)


def test_shared_flags_are_unchanged() -> None:
    parser = argparse.ArgumentParser()
    TransformerSettings.add_arguments(parser)
    args = parser.parse_args(["--http-port", "9", "--grpc_port", "0", "--max-header-bytes", "100",
                              "--log-level", "debug", "--openai-route-prefix", "/x"])
    s = TransformerSettings.from_namespace(args)
    assert (s.http_port, s.grpc_port, s.max_header_bytes, s.log_level, s.openai_route_prefix) == (
        9, 0, 100, "debug", "/x"
    )


def test_redefault_keeps_the_help() -> None:
    field = ServerSettings.redefault("http_port", 1234)
    assert field.default == 1234
    assert field.metadata == fields(ServerSettings)["http_port"].metadata


@pytest.mark.parametrize("cls", SERVICES)
def test_the_server_is_built_from_the_shared_fields(cls: type[ServerSettings]) -> None:
    settings = cls.from_env()
    settings = dataclasses.replace(settings, host="127.0.0.2", http_port=9100, grpc_port=0,
                                   grace_period_s=7.5, max_body_bytes=1234, max_header_bytes=5678)
    server = SemserveModelServer.from_settings(settings)
    assert (server.host, server.http_port, server.grace, server.max_body_bytes,
            server.max_header_bytes) == ("127.0.0.2", 9100, 7.5, 1234, 5678)
    assert server.enable_grpc is False  # gRPC port 0 disables gRPC
    grpc_on = SemserveModelServer.from_settings(dataclasses.replace(settings, grpc_port=9101))
    assert (grpc_on.enable_grpc, grpc_on.grpc_port) == (True, 9101)
