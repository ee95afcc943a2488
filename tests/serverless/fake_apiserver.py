"""A FAKE Kubernetes API server for testing `semserve tenant` without a cluster.

Real HTTP on loopback, serving what the kubernetes package's DynamicClient asks for: the discovery
documents (`/version`, `/api`, `/apis`, and the resource lists `/api/v1` and `/apis/GROUP/VERSION` of
the kinds in RESOURCES), then GET/PATCH/DELETE `/api/v1/namespaces/NS/PLURAL/NAME`,
`/apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]` and cluster-wide lists `/apis/GROUP/VERSION/PLURAL`
of those kinds only (anything else is a 404, as on a cluster without that API). It stores objects in
memory and, like the real API server plus KServe's admission webhook, validates every written body:
strict CRD schemas from shared/schemas, kubernetes-validate for core kinds, and the webhook rules of
serverless.tenant_validate. Server-side apply is modelled with per-field owners (leaf fields; lists
atomic), so conflicts between field managers are real; merge patches follow RFC 7386.
Not modelled: resourceVersion/optimistic concurrency, watches, defaulting, controllers (tests play
KServe and Knative by writing status and PodAutoscalers with `put`).
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from serverless import tenant_validate as tv
from serverless.kustomize import merge_patch  # RFC 7386, as the API server applies it

Key = tuple[str, str, str, str]  # (apiVersion, plural, namespace, name)
Path_ = tuple[str, ...]


@dataclass(frozen=True)
class ServedResource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True


# What the fake cluster serves: the kinds the overlays hold, and those `semserve tenant status` reads
# (KServe and Knative installed, plus the Prometheus operator's CRDs).
RESOURCES = (
    ServedResource("v1", "ConfigMap", "configmaps"),
    ServedResource("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ServedResource("v1", "Pod", "pods"),
    ServedResource("v1", "Secret", "secrets"),
    ServedResource("v1", "Service", "services"),
    ServedResource("v1", "Namespace", "namespaces", namespaced=False),
    ServedResource("apps/v1", "Deployment", "deployments"),
    ServedResource("apps/v1", "StatefulSet", "statefulsets"),
    ServedResource("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    ServedResource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ServedResource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    ServedResource("monitoring.coreos.com/v1", "PodMonitor", "podmonitors"),
    ServedResource("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules"),
    ServedResource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    ServedResource("serving.kserve.io/v1beta1", "InferenceService", "inferenceservices"),
    ServedResource("serving.kserve.io/v1alpha1", "ServingRuntime", "servingruntimes"),
    ServedResource("serving.knative.dev/v1", "Revision", "revisions"),
    ServedResource("autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler", "podautoscalers"),
)
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _leaves(obj: Any, prefix: Path_ = ()) -> dict[Path_, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[Path_, Any] = {}
        for k, v in obj.items():
            out.update(_leaves(v, (*prefix, str(k))))
        return out
    return {prefix: obj}


def _set(obj: dict[str, Any], path: Path_, value: Any) -> None:
    for p in path[:-1]:
        obj = obj.setdefault(p, {})
    obj[path[-1]] = copy.deepcopy(value)


def _unset(obj: dict[str, Any], path: Path_) -> None:
    parents = []
    for p in path[:-1]:
        if not isinstance(obj.get(p), dict):
            return
        parents.append((obj, p))
        obj = obj[p]
    obj.pop(path[-1], None)
    for parent, key in reversed(parents):  # drop emptied maps
        if parent[key] == {}:
            parent.pop(key)


class FakeApiServer:
    """In-memory objects behind real HTTP; `forbid` marks (verb, plural) pairs RBAC denies."""

    def __init__(self, token: str = "test-token", schemas_dir: Path | None = None) -> None:
        self.token = token
        self.objects: dict[Key, dict[str, Any]] = {}
        self.owners: dict[Key, dict[Path_, str]] = {}
        self.forbid: set[tuple[str, str]] = set()
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.schemas = tv.load_crd_schemas(str(schemas_dir)) if schemas_dir else None
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": self.token}}],
                    "contexts": [
                        {
                            "name": "fake",
                            "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                        }
                    ],
                }
            )
        )
        return path

    # Tests play the controllers: write status, revisions, PodAutoscalers directly.
    def put(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        plural = self.served(obj["apiVersion"], kind=obj["kind"]).plural
        with self.lock:
            self.objects[(obj["apiVersion"], plural, meta["namespace"], meta["name"])] = copy.deepcopy(obj)

    def get(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((api_version, plural, namespace, name))

    @staticmethod
    def served(api_version: str, *, kind: str = "", plural: str = "") -> ServedResource:
        for r in RESOURCES:
            if r.api_version == api_version and (r.kind == kind or r.plural == plural):
                return r
        raise KeyError(f"the fake API server does not serve {api_version} {kind or plural}")

    # --- Discovery (what DynamicClient reads before its first request) -----------------------

    def discovery(self, path: str) -> dict[str, Any] | None:
        """The discovery document at `path`, or None when `path` is not a discovery path."""
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        groups: dict[str, list[str]] = {}
        for r in RESOURCES:
            if "/" in r.api_version:
                group, version = r.api_version.split("/")
                if version not in groups.setdefault(group, []):
                    groups[group].append(version)
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                        "preferredVersion": {
                            "groupVersion": f"{group}/{versions[0]}",
                            "version": versions[0],
                        },
                    }
                    for group, versions in groups.items()
                ],
            }
        parts = path.strip("/").split("/")
        if parts == ["api", "v1"]:
            group_version = "v1"
        elif parts[0] == "apis" and len(parts) == 3:
            group_version = f"{parts[1]}/{parts[2]}"
        else:
            return None
        resources = [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
            }
            for r in RESOURCES
            if r.api_version == group_version
        ]
        if not resources:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }

    # --- HTTP --------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlparse(self.path)
                query = parse_qs(url.query)
                server.requests.append((method, url.path, query))
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                    return
                code, body = server.dispatch(
                    method, url.path, query, raw, self.headers.get("Content-Type", "")
                )
                self._send(code, body)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        return Handler

    def dispatch(
        self, method: str, path: str, query: dict[str, list[str]], raw: bytes, content_type: str
    ) -> tuple[int, dict[str, Any]]:
        document = self.discovery(path)
        if document is not None:
            if method != "GET":
                return 405, _status(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
            return 200, document
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            api_version, rest = "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, name = "", ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, plural = rest[1], rest[2]
            name = rest[3] if len(rest) > 3 else ""
        elif len(rest) == 1:
            plural = rest[0]
        else:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        try:
            self.served(api_version, plural=plural)
        except KeyError:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}[method]
        if (verb, plural) in self.forbid:
            group = api_version.rpartition("/")[0]
            res = f"{plural}.{group}" if group else plural
            return 403, _status(
                403,
                "Forbidden",
                f'{res} "{name}" is forbidden: User '
                f'"system:serviceaccount:{namespace}:semserve-tenant-client" cannot {verb} '
                f'resource "{plural}" in API group "{group}" in the namespace "{namespace}"',
            )
        with self.lock:
            if verb == "list":
                return 200, self._list(api_version, plural, namespace, query)
            key = (api_version, plural, namespace, name)
            if verb == "get":
                if key not in self.objects:
                    return 404, _not_found(plural, api_version, name)
                return 200, copy.deepcopy(self.objects[key])
            if verb == "delete":
                if self.objects.pop(key, None) is None:
                    return 404, _not_found(plural, api_version, name)
                self.owners.pop(key, None)
                return 200, _status(200, "", "", status="Success")
            body = yaml.safe_load(raw.decode()) if raw else {}
            manager = (query.get("fieldManager") or [""])[0]
            dry_run = (query.get("dryRun") or [""])[0] == "All"
            if content_type.startswith("application/apply-patch+yaml"):
                if not manager:
                    return 400, _status(
                        400, "BadRequest", "PATCH is not supported: fieldManager is required for apply"
                    )
                return self._apply(key, body, manager, (query.get("force") or [""])[0] == "true", dry_run)
            if content_type.startswith("application/merge-patch+json"):
                if key not in self.objects:
                    return 404, _not_found(plural, api_version, name)
                new = merge_patch(self.objects[key], body)
                return self._store(key, new, {p: manager or "unknown" for p in _leaves(body)}, dry_run)
            return 415, _status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format {content_type}",
            )

    def _list(
        self, api_version: str, plural: str, namespace: str, query: dict[str, list[str]]
    ) -> dict[str, Any]:
        selector = (query.get("labelSelector") or [""])[0]
        items = []
        for (av, pl, ns, _), obj in sorted(self.objects.items()):
            if av != api_version or pl != plural or (namespace and ns != namespace):
                continue
            labels = (obj.get("metadata") or {}).get("labels") or {}
            ok = True
            for term in filter(None, selector.split(",")):
                k, _, v = term.partition("=")
                ok = ok and (k in labels if not _ else labels.get(k) == v)
            if ok:
                items.append(copy.deepcopy(obj))
        return {"kind": "List", "apiVersion": api_version, "items": items}

    def _apply(
        self, key: Key, body: dict[str, Any], manager: str, force: bool, dry_run: bool
    ) -> tuple[int, dict[str, Any]]:
        api_version, _, namespace, name = key
        meta = body.get("metadata") or {}
        if body.get("apiVersion") != api_version or meta.get("name") != name:
            return 400, _status(
                400, "BadRequest", "the name or apiVersion of the object does not match the URL"
            )
        if meta.get("namespace", namespace) != namespace:
            return 400, _status(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        current = copy.deepcopy(self.objects.get(key) or {})
        owners = dict(self.owners.get(key, {}))
        applied = {p: v for p, v in _leaves(body).items()}
        old = _leaves(current)
        conflicts = [
            p for p, v in applied.items() if p in owners and owners[p] != manager and old.get(p) != v
        ]
        if conflicts and not force:
            detail = "; ".join(f'conflict with "{owners[p]}": .{".".join(p)}' for p in conflicts)
            return 409, _status(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {detail}")
        for p, m in list(owners.items()):
            if m == manager and p not in applied:  # fields this manager no longer applies go away
                _unset(current, p)
                owners.pop(p)
        for p, v in applied.items():
            if p:
                _set(current, p, v)
            owners[p] = manager
        current.setdefault("metadata", {})["namespace"] = namespace
        return self._store(key, current, owners, dry_run, replace_owners=True)

    def _store(
        self,
        key: Key,
        obj: dict[str, Any],
        owners: dict[Path_, str],
        dry_run: bool,
        replace_owners: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        # Like the real thing: schema (strict field validation) first -> 422, then the webhook -> 400.
        webhook = tv.webhook_rules(obj)
        schema_errors = [e for e in tv.validate_objects([obj], self.schemas) if e not in webhook]
        if schema_errors:
            return 422, _status(
                422, "Invalid", f"{tv._object_ref(obj)} is invalid: {'; '.join(schema_errors)}"
            )
        if webhook:
            return 400, _status(
                400,
                "BadRequest",
                'admission webhook "inferenceservice.kserve-webhook-server.'
                f'validator" denied the request: {"; ".join(webhook)}',
            )
        if not dry_run:
            self.objects[key] = obj
            self.owners[key] = owners if replace_owners else {**self.owners.get(key, {}), **owners}
        return 200, copy.deepcopy(obj)


def _status(code: int, reason: str, message: str, status: str = "Failure") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": status,
        "message": message,
        "reason": reason,
        "code": code,
    }


def _not_found(plural: str, api_version: str, name: str) -> dict[str, Any]:
    group = api_version.rpartition("/")[0]
    return _status(404, "NotFound", f'{plural}{"." + group if group else ""} "{name}" not found')


@contextmanager
def running(schemas_dir: Path | None) -> Iterator[FakeApiServer]:
    server = FakeApiServer(schemas_dir=schemas_dir).start()
    try:
        yield server
    finally:
        server.stop()
