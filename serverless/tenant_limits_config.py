"""Per-tenant limits on a tenant: the ConfigMap NAME-tenant-limits that holds the transformer's
--tenant-limits-file (limits.json), what `semserve tenant create|update`'s limit flags write into
it, and the validation rules that keep a hand-edited one from reaching the pods.

One table per InferenceService: its keys are the tenants the transformer sees, i.e. the API-key
tenants (the namespace's Secret semserve-api-keys) when auth is on, or the deployment's one tenant
(`--tenant`, "default" unless set) when it is off; "default" covers every tenant without an entry.
The flags set the "default" entry unless --limits-tenant names another. Every value is parsed by
semserve.tenant_limits.parse_entry, the transformer's own parser, so a bad value is refused here
with the very message the transformer would give at start (naming the tenant and the field).

The ConfigMap is mounted as a directory (a subPath mount never sees an update), so a change
reaches running pods within the kubelet's ConfigMap sync and the transformer re-reads the file.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from semserve.tenant_limits import DEFAULT, FIELDS, LimitsError, LimitsTable, parse_entry

BASE_CONFIGMAP = "semserve-tenant-limits"  # its name in manifests/base; per tenant NAME-tenant-limits
CONFIGMAP_SUFFIX = "-tenant-limits"
NAME_LABEL = "app.kubernetes.io/name"
LIMITS_KEY = "limits.json"
LIMITS_ENV = "SEMSERVE_TRANSFORMER_TENANT_LIMITS_FILE"
# The value that lifts one limit in `update` (a missing field is no limit).
NO_LIMIT = "none"


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def configmap_name(tenant: str) -> str:
    return tenant + CONFIGMAP_SUFFIX


def is_limits_configmap(doc: dict[str, Any]) -> bool:
    labels = (doc.get("metadata") or {}).get("labels") or {}
    return doc.get("kind") == "ConfigMap" and labels.get(NAME_LABEL) == BASE_CONFIGMAP


def _flag_value(raw: str) -> object:
    # A flag is text; the file's values are JSON numbers. Numbers become numbers, anything else
    # stays the text it was, so parse_entry refuses it with its own message ("got 'abc'").
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, int | float) and not isinstance(value, bool) else raw


def edit_table(
    document: object, tenant: str, values: dict[str, str | None], *, remove: bool = False
) -> LimitsTable:
    """`document` (the current limits.json, parsed) with `tenant`'s entry changed: each given flag
    value set (NO_LIMIT drops that field), or the entry removed. Raises LimitsError naming the
    tenant and the field, for the new values and for any bad entry already there."""
    if not tenant:
        raise LimitsError('--limits-tenant: a tenant name, or "default"')
    table = dict(document) if isinstance(document, dict) else {}
    if not isinstance(document, dict):
        LimitsTable.parse(document)  # the parser's own message for a file that is not an object
    given = {f: v for f, v in values.items() if v is not None}
    if remove:
        table.pop(tenant, None)
    elif given:
        entry = table.get(tenant, {})
        entry = dict(entry) if isinstance(entry, dict) else entry
        for field, raw in given.items():
            if raw.strip().lower() == NO_LIMIT and isinstance(entry, dict):
                entry.pop(field, None)
                continue
            value = _flag_value(raw)
            parse_entry(tenant, {field: value})  # this value alone first: the message names it
            if isinstance(entry, dict):
                entry[field] = value
        table[tenant] = entry
    return LimitsTable.parse(table)


def limits_json(table: LimitsTable) -> str:
    return json.dumps(table.as_json(), indent=2, sort_keys=True) + "\n"


def flag_values(args: Any) -> dict[str, str | None]:
    """The limit flags of a parsed command line, by field name."""
    return {f: getattr(args, f) for f in FIELDS}


def set_limits(docs: list[dict[str, Any]], table: LimitsTable) -> None:
    """Write `table` into the tenant's limits ConfigMap among `docs` (create)."""
    found = [d for d in docs if is_limits_configmap(d)]
    if not found:
        raise LimitsError(f"the overlay has no ConfigMap labelled {NAME_LABEL}={BASE_CONFIGMAP}")
    for doc in found:
        doc.setdefault("data", {})[LIMITS_KEY] = limits_json(table)


def read_table(doc: dict[str, Any]) -> object:
    """The parsed limits.json of a ConfigMap (not yet checked), or LimitsError naming where."""
    ref = f"ConfigMap/{(doc.get('metadata') or {}).get('name', '?')}"
    raw = (doc.get("data") or {}).get(LIMITS_KEY)
    if raw is None:
        raise LimitsError(f"{ref}: data.{LIMITS_KEY}: missing (the transformer would not start)")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise LimitsError(
            f"{ref}: data.{LIMITS_KEY}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None


def describe(table: LimitsTable) -> str:
    """One line per entry, for the command's output."""
    if not table.entries:
        return "  (no entries: no limits, every tenant weight 1)"
    lines = []
    for tenant, limits in sorted(table.entries.items(), key=lambda kv: (kv[0] != DEFAULT, kv[0])):
        fields = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in limits.as_json().items()) or "no limits, weight 1"  # fmt: skip
        lines.append(f"  {tenant}: {fields}")
    return "\n".join(lines)


# --- Validation (serverless/tenant_validate.py runs these on every object) ---------------------


def _transformer_container(isvc: dict[str, Any]) -> dict[str, Any] | None:
    containers = ((isvc.get("spec") or {}).get("transformer") or {}).get("containers") or []
    return containers[0] if containers else None  # the first container is semserve's transformer


def _holds(mount_path: str, path: str) -> bool:
    return bool(mount_path) and (path == mount_path or path.startswith(mount_path.rstrip("/") + "/"))


def _mount_rules(isvc: dict[str, Any]) -> list[str]:
    container = _transformer_container(isvc)
    if container is None:
        return []
    ref = f"InferenceService/{(isvc.get('metadata') or {}).get('name', '?')}"
    path = next((str(e.get("value")) for e in container.get("env") or []
                 if e.get("name") == LIMITS_ENV and e.get("value")), None)  # fmt: skip
    if path is None:
        return []
    where = f"{ref}: spec.transformer.containers[0] env {LIMITS_ENV}={path}"
    mounts = [m for m in container.get("volumeMounts") or [] if _holds(str(m.get("mountPath", "")), path)]
    if not mounts:
        return [f"{where}: no volumeMount holds it (mount the ConfigMap {BASE_CONFIGMAP} as a directory)"]
    mount = max(mounts, key=lambda m: len(str(m.get("mountPath", ""))))
    if mount.get("subPath") or mount.get("subPathExpr"):
        return [
            f"{where}: volumeMount {mount.get('name')!r} uses subPath, which never sees a ConfigMap "
            "update: mount the ConfigMap as a directory"
        ]
    volumes = ((isvc.get("spec") or {}).get("transformer") or {}).get("volumes") or []
    volume = next((v for v in volumes if v.get("name") == mount.get("name")), None)
    if volume is None:
        return [f"{where}: volumeMount {mount.get('name')!r} names no volume of spec.transformer.volumes"]
    items = (volume.get("configMap") or {}).get("items")
    inside = posixpath.relpath(path, str(mount.get("mountPath")))
    if items and not any(i.get("path") == inside for i in items):
        return [f"{where}: volume {mount.get('name')!r} lists items without {inside!r}"]
    return []


def limits_rules(doc: dict[str, Any]) -> list[str]:
    """Problems with a tenant's limits: a limits ConfigMap whose limits.json the transformer would
    refuse (the line names the tenant and the field), or a transformer that reads its limits file
    from a mount that never updates."""
    if doc.get("kind") == "InferenceService":
        return _mount_rules(doc)
    if not is_limits_configmap(doc):
        return []
    ref = f"ConfigMap/{(doc.get('metadata') or {}).get('name', '?')}"
    try:
        LimitsTable.parse(read_table(doc))
    except LimitsError as e:
        text = str(e)
        return [text if text.startswith(ref) else f"{ref}: data.{LIMITS_KEY}: {text}"]
    return []
