"""API keys -> tenant. Keys are stored hashed (sha256) and compared in constant time; the tenant
comes from the key (or the deployment's one tenant when auth is off), never from a header a client
chooses.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from semserve.errors import ServingError

# The tenant of the request being served, set by the HTTP and gRPC auth middleware (auth_middleware.py).
tenant_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


class Unauthenticated(ServingError):
    http_status = 401
    openai_type = "authentication_error"


class Forbidden(ServingError):
    http_status = 403
    openai_type = "permission_error"


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _digest(entry: str, where: str) -> bytes:
    if not entry.startswith("sha256:") or len(entry) != 7 + 64:
        raise ValueError(f"{where}: keys must be stored as 'sha256:<64 hex>' (see `semserve auth hash`)")
    return bytes.fromhex(entry[7:])


@dataclass(frozen=True)
class KeyEntry:
    digest: bytes
    tenant: str | None  # None: an admin key


def key_from_headers(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return headers.get("x-api-key") or None


class Authenticator:
    def __init__(self, entries: list[KeyEntry], default_tenant: str) -> None:
        self.entries = entries
        self.enabled = any(e.tenant is not None for e in entries)
        self.default_tenant = default_tenant

    @classmethod
    def from_files(
        cls, api_keys_file: Path | None, admin_keys_file: Path | None, default_tenant: str
    ) -> Authenticator:
        entries: list[KeyEntry] = []
        if api_keys_file is not None:
            data = json.loads(Path(api_keys_file).read_text())
            if not isinstance(data, dict):
                raise ValueError(f"{api_keys_file}: expected an object {{tenant: [keys]}}")
            for tenant, keys in data.items():
                if not isinstance(tenant, str) or not tenant:
                    raise ValueError(f"{api_keys_file}: tenant names must be non-empty strings")
                for k in [keys] if isinstance(keys, str) else keys:
                    entries.append(KeyEntry(_digest(k, str(api_keys_file)), tenant))
        if admin_keys_file is not None:
            admins = json.loads(Path(admin_keys_file).read_text())
            for k in [admins] if isinstance(admins, str) else admins:
                entries.append(KeyEntry(_digest(k, str(admin_keys_file)), None))
        return cls(entries, default_tenant)

    def _match(self, key: str | None) -> KeyEntry | None:
        if not key:
            return None
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        # Compare against every entry so the time taken does not depend on which one matched.
        for entry in self.entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return found

    def tenant_for(self, headers: dict[str, str]) -> str:
        """The tenant of a data-plane request, or Unauthenticated."""
        if not self.enabled:
            return self.default_tenant
        entry = self._match(key_from_headers(headers))
        if entry is None or entry.tenant is None:
            raise Unauthenticated("missing or invalid API key")
        return entry.tenant

    def check_admin(self, headers: dict[str, str]) -> None:
        if not self.enabled:
            return
        entry = self._match(key_from_headers(headers))
        if entry is None:
            raise Unauthenticated("missing or invalid API key")
        if entry.tenant is not None:
            raise Forbidden("admin routes need an admin key")
