"""The Kubernetes API as `semserve tenant` uses it: the kubernetes package's DynamicClient (API discovery
finds each kind's path), JSON documents in and out, and every failure described in one line.

Discovery reads /version, /api and /apis, which Kubernetes' default `system:discovery` and
`system:public-info-viewer` roles grant every authenticated user: the tenant client's Role
(manifests/tenant-client) needs nothing more for it. The discoverer caches what it learns in a file
(`discovery_cache`), so later runs skip it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Document = dict[str, Any]

# Server-side apply owner of everything `semserve tenant create` applies; the scale commands use their
# own manager so that re-applying the overlay takes minReplicas back (forcing: the repo owns it).
FIELD_MANAGER = "semserve-tenant"
SCALE_FIELD_MANAGER = f"{FIELD_MANAGER}-scale"
# (connect, read) seconds for every request: an unreachable server is reported at once.
REQUEST_TIMEOUT_S = (5, 60)


@dataclass
class Client:
    """GET, list, apply, merge-patch and delete of any kind the API server serves."""

    api: Any  # kubernetes.client.ApiClient
    # Where discovery is cached between runs (None: the kubernetes package's file in the temp dir).
    discovery_cache: Path | None = None
    _dynamic: Any = field(default=None, init=False, repr=False)

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    @property
    def dynamic(self) -> Any:
        # Created on first use: its discovery (GET /version, /apis) needs the server, connect() does not.
        if self._dynamic is None:
            from kubernetes.dynamic import DynamicClient

            cache = str(self.discovery_cache) if self.discovery_cache is not None else None
            self._dynamic = DynamicClient(self.api, cache_file=cache)
        return self._dynamic

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Document:
        res = self._resource(api_version, kind)
        return self.dynamic.get(
            res, name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT_S
        ).to_dict()

    def get_or_none(self, api_version: str, kind: str, namespace: str, name: str) -> Document | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self.get(api_version, kind, namespace, name)
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str = "") -> list[Document]:
        res = self._resource(api_version, kind)
        found = self.dynamic.get(
            res, namespace=namespace, label_selector=selector or None, _request_timeout=REQUEST_TIMEOUT_S
        )
        return list(found.to_dict().get("items") or [])

    def apply(self, doc: Document, *, dry_run: bool = False) -> Document:
        meta = doc["metadata"]
        return self.dynamic.server_side_apply(
            self._resource(doc["apiVersion"], doc["kind"]),
            body=doc,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            dry_run="All" if dry_run else None,
            _request_timeout=REQUEST_TIMEOUT_S,
        ).to_dict()

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Document
    ) -> Document:
        return self.dynamic.patch(
            self._resource(api_version, kind),
            body=patch,
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
            field_manager=SCALE_FIELD_MANAGER,
            _request_timeout=REQUEST_TIMEOUT_S,
        ).to_dict()

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """False when it was not there."""
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            self.dynamic.delete(
                self._resource(api_version, kind),
                name=name,
                namespace=namespace,
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            return True
        except NotFoundError:
            return False


def connect(
    kubeconfig: str | None = None, context: str | None = None, discovery_cache: Path | None = None
) -> Client:
    """In-cluster config inside a pod (service account token), else the kubeconfig."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    cfg.retries = 0  # an unreachable server is reported at once, not after urllib3's retries
    return Client(client.ApiClient(cfg), discovery_cache)


_HINTS = {
    401: "check the kubeconfig's credentials",
    403: "the service account lacks this permission (see manifests/tenant-client)",
    404: "not found (is KServe installed? right namespace?)",
    409: "conflict with another writer",
}


def describe_error(e: BaseException) -> str:
    """One line for any failure talking to the cluster."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    if isinstance(e, ApiException):
        message, reason = "", str(e.reason or "")
        try:
            status = json.loads(e.body or "{}")
            message = str(status.get("message", ""))
            reason = str(status.get("reason") or reason)
        except (ValueError, AttributeError):
            message = str(e.body or "")
        hint = _HINTS.get(int(e.status or 0), "")
        line = f"{e.status} {reason}: {' '.join(message.split())}"
        return f"{line} ({hint})" if hint else line
    if isinstance(e, ResourceNotFoundError):
        return f"the API server does not serve this kind ({e}): is KServe (and Knative) installed?"
    if isinstance(e, ConfigException):
        return f"no usable Kubernetes config: {e}"
    if isinstance(e, OSError | ConnectionError) or type(e).__module__.startswith("urllib3"):
        reason = getattr(e, "reason", None) or e
        return f"cannot reach the API server: {' '.join(str(reason).split())}"
    return f"{type(e).__name__}: {e}"
