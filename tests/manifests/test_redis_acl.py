"""The in-cluster Redis never gets its password in argv: an init container hashes the Secret into an
ACL file that redis-server loads with --aclfile, and the probes authenticate with REDISCLI_AUTH.

The init container's script is taken from the rendered StatefulSet and run here with `sh`, with only
its two path variables (SECRET_FILE, ACL_FILE) pointed at temp files; the real local Valkey +
RediSearch server (semserve/tooling/local_redis.py) is then started on the ACL file it wrote.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from semserve.tooling.local_redis import RedisServer, free_port
from tests.manifests.conftest import by_kind

Docs = dict[str, list[dict[str, Any]]]

SECRET = "semserve-redis"
SECRET_KEY = "password"


def statefulset(rendered: Docs) -> dict[str, Any]:
    (sts,) = [d for d in by_kind(rendered["redis"], "StatefulSet") if d["metadata"]["name"] == SECRET]
    return sts


def pod_spec(rendered: Docs) -> dict[str, Any]:
    spec: dict[str, Any] = statefulset(rendered)["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def redis_container(spec: dict[str, Any]) -> dict[str, Any]:
    (c,) = [c for c in spec["containers"] if c["name"] == "redis"]
    return c


def acl_init(spec: dict[str, Any]) -> dict[str, Any]:
    (c,) = spec.get("initContainers", [])
    return c


def env_values(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def redis_args(c: dict[str, Any]) -> list[str]:
    # The image's entrypoint expands $REDIS_ARGS unquoted: word splitting, as shlex does here.
    return shlex.split(env_values(c)["REDIS_ARGS"])


def mount_of(c: dict[str, Any], path: str) -> dict[str, Any]:
    """The volumeMount whose mountPath contains `path`."""
    (m,) = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    return m


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (v,) = [v for v in spec["volumes"] if v["name"] == name]
    return v


def init_script(spec: dict[str, Any]) -> str:
    c = acl_init(spec)
    argv = [*c.get("command", []), *c.get("args", [])]
    assert argv[:2] == ["sh", "-c"] and len(argv) == 3, argv
    return str(argv[2])


# -- the rendered manifest ----------------------------------------------------------------------------


def test_no_password_in_any_process_arguments(rendered: Docs) -> None:
    spec = pod_spec(rendered)
    for c in all_containers(spec):
        texts = [*c.get("command", []), *c.get("args", [])]
        texts += [e.get("value", "") for e in c.get("env", [])]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            texts += c.get(probe, {}).get("exec", {}).get("command", [])
        for text in texts:
            assert "requirepass" not in text, (c["name"], text)
            assert "masterauth" not in text, (c["name"], text)
            # $(VAR) is the kubelet expanding an env var into args or into another env var's value
            # (REDIS_ARGS reaches redis-server's argv): nothing may be expanded that way here.
            assert not re.search(r"\$\([A-Za-z_][A-Za-z0-9_]*\)", text), (c["name"], text)
        # The password is only ever an env var for redis-cli (REDISCLI_AUTH), never REDIS_PASSWORD
        # or the like that a script could put on a command line.
        secret_envs = [
            e["name"]
            for e in c.get("env", [])
            if e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") == SECRET_KEY
        ]
        assert set(secret_envs) <= {"REDISCLI_AUTH"}, (c["name"], secret_envs)
    args = redis_args(redis_container(spec))
    assert "--aclfile" in args and not any("pass" in a.lower() for a in args), args


def test_other_redis_settings_are_kept(rendered: Docs) -> None:
    args = redis_args(redis_container(pod_spec(rendered)))
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs == {
        "--aclfile": pairs["--aclfile"],
        "--dir": "/data",
        "--appendonly": "yes",
        "--appendfsync": "everysec",
        "--maxmemory": "1600mb",
        "--maxmemory-policy": "volatile-lru",
    }


def test_probes_authenticate_with_rediscli_auth(rendered: Docs) -> None:
    c = redis_container(pod_spec(rendered))
    (auth,) = [e for e in c["env"] if e["name"] == "REDISCLI_AUTH"]
    assert auth["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": SECRET_KEY}
    for probe in ("readinessProbe", "livenessProbe"):
        command = c[probe]["exec"]["command"]
        words = shlex.split(command[-1]) if command[:2] == ["sh", "-c"] else command
        assert "redis-cli" in words, command
        assert not {"-a", "--pass", "--user", "--askpass", "-u"} & set(words), command


def test_acl_file_flows_from_the_secret_to_redis(rendered: Docs) -> None:
    """The init container reads the Secret key the transformer reads, writes where redis loads."""
    spec = pod_spec(rendered)
    init, server = acl_init(spec), redis_container(spec)
    assert init["image"] == server["image"]
    paths = env_values(init)
    secret_mount = mount_of(init, paths["SECRET_FILE"])
    assert secret_mount.get("readOnly") is True
    secret_volume = volume(spec, secret_mount["name"])["secret"]
    assert secret_volume["secretName"] == SECRET
    relative = paths["SECRET_FILE"][len(secret_mount["mountPath"].rstrip("/")) + 1 :]
    assert {"key": SECRET_KEY, "path": relative} in secret_volume["items"]
    assert secret_volume["defaultMode"] & 0o077 == 0  # not world/group readable by mode

    # The ACL file: written by the init container, read (read-only) by redis, same emptyDir.
    args = redis_args(server)
    acl_path = args[args.index("--aclfile") + 1]
    assert acl_path == paths["ACL_FILE"]
    init_mount, server_mount = mount_of(init, acl_path), mount_of(server, acl_path)
    assert init_mount["name"] == server_mount["name"] and init_mount["mountPath"] == server_mount["mountPath"]
    assert server_mount.get("readOnly") is True
    assert volume(spec, init_mount["name"])["emptyDir"]["medium"] == "Memory"

    # The transformer authenticates with the very same Secret key.
    (isvc,) = by_kind(rendered["base"], "InferenceService")
    env = {e["name"]: e for e in isvc["spec"]["transformer"]["containers"][0]["env"]}
    ref = env["SEMSERVE_CACHE_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": SECRET, "key": SECRET_KEY}


def test_security_context_stays_strict(rendered: Docs) -> None:
    spec = pod_spec(rendered)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    for c in all_containers(spec):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert "privileged" not in sc and sc.get("runAsUser", 1) != 0, c["name"]
    assert acl_init(spec)["securityContext"]["readOnlyRootFilesystem"] is True


# -- the init script, run for real, and Redis on the file it writes ----------------------------------


def run_init_script(rendered: Docs, secret_file: Path, acl_file: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("sh") is None or shutil.which("sha256sum") is None:
        pytest.skip("needs sh and sha256sum")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SECRET_FILE": str(secret_file),
           "ACL_FILE": str(acl_file)}  # fmt: skip
    return subprocess.run(["sh", "-c", init_script(pod_spec(rendered))], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def test_init_script_writes_a_hashed_acl_file(rendered: Docs, tmp_path: Path) -> None:
    # Spaces, quotes, a shell expansion and a trailing newline: hashed byte for byte, never evaluated.
    password = f"pw {uuid.uuid4().hex} \"'$(id) `id` \\ #x\n"
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "password").write_bytes(password.encode())
    acl = tmp_path / "acl" / "users.acl"
    acl.parent.mkdir()
    done = run_init_script(rendered, secret / "password", acl)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(password.encode()).hexdigest()
    assert acl.read_text() == f"user default on #{digest} ~* &* +@all\n"
    assert stat.S_IMODE(acl.stat().st_mode) == 0o600
    assert sorted(p.name for p in acl.parent.iterdir()) == ["users.acl"]  # no temp file left
    assert password.strip() not in done.stdout + done.stderr


@pytest.mark.parametrize("content", [None, b""])
def test_init_script_fails_without_a_password(rendered: Docs, tmp_path: Path, content: bytes | None) -> None:
    secret = tmp_path / "password"
    if content is not None:
        secret.write_bytes(content)
    acl = tmp_path / "users.acl"
    done = run_init_script(rendered, secret, acl)
    assert done.returncode != 0 and "missing or empty" in done.stderr
    assert not acl.exists()  # Redis would otherwise start with a passwordless default user


def test_redis_on_the_generated_acl_file(rendered: Docs, tmp_path: Path) -> None:
    password = f"s3cret-{uuid.uuid4().hex} with 'quotes'"
    secret = tmp_path / "secret" / "password"
    secret.parent.mkdir()
    secret.write_text(password)
    acl = tmp_path / "acl" / "users.acl"
    acl.parent.mkdir()
    done = run_init_script(rendered, secret, acl)
    assert done.returncode == 0, done.stderr
    assert password not in acl.read_text()

    server = RedisServer(free_port(), data_dir=tmp_path / "data", password=password, acl_file=acl)
    assert not any(password in a for a in server.command())
    with server:
        assert server.process is not None
        pid = server.process.pid
        # What `ps` shows (Valkey rewrites its process title over argv; either way, no password).
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert password.encode() not in Path(f"/proc/{pid}/environ").read_bytes()

        good = redis.Redis(port=server.port, password=password, decode_responses=True)
        assert good.ping() and good.acl_whoami() == "default"
        assert good.config_get("aclfile") == {"aclfile": str(acl.resolve())}
        assert good.config_get("requirepass") == {"requirepass": ""}
        assert "search" in {m["name"] for m in good.module_list()}
        good.close()

        # redis-py refuses both (AuthenticationError); the server's own replies, read off the wire,
        # are NOAUTH and WRONGPASS.
        once = Retry(NoBackoff(), 0)  # redis-py retries connection errors, auth failures among them
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=server.port, retry=once).ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=server.port, password=password + "x", retry=once).ping()
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            assert reply(conn, "PING").startswith(b"-NOAUTH ")
            assert reply(conn, "GET", "k").startswith(b"-NOAUTH ")
            assert reply(conn, "AUTH", password + "x").startswith(b"-WRONGPASS ")
            assert reply(conn, "AUTH", "default", "").startswith(b"-WRONGPASS ")
            assert reply(conn, "PING").startswith(b"-NOAUTH ")
            assert reply(conn, "AUTH", password) == b"+OK"
            assert reply(conn, "PING") == b"+PONG"


def reply(conn: socket.socket, *args: str) -> bytes:
    """Send one RESP command, return the first line of the reply (e.g. b"-NOAUTH ...", b"+OK")."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    conn.sendall(b"".join(parts))
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = conn.recv(1)
        assert chunk, "connection closed"
        line += chunk
    return line[:-2]
