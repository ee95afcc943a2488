"""The embedder's forward passes: token ids in, last hidden state (batch, seq, dim) float32 out,
on eager torch (optionally dynamic int8) or on an ONNX Runtime session over a prepared file.

torch and transformers are imported only inside these functions: with the ONNX backends and a
prepared file, a transformer never imports them at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Runner(Protocol):
    """One forward pass: token ids in, last hidden state (batch, seq, dim) float32 out."""

    def __call__(self, enc: dict[str, np.ndarray]) -> np.ndarray: ...


def input_names(tokenizer: Any) -> list[str]:
    """The model inputs this (transformers) tokenizer produces, in the model's argument order."""
    probe = tokenizer(["x"], return_tensors="np")
    return [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in probe]


def load_torch_model(model_path: Path, threads: int) -> Any:
    import torch
    from transformers import AutoModel

    if threads > 0:
        # Process-wide, and only when torch runs here: with the ONNX backends and a cached
        # export, torch is never imported at all (faster start, ~300 MB less memory).
        torch.set_num_threads(threads)

    # Eager attention: identical numbers to SDPA here, and traces cleanly for the ONNX export.
    model = AutoModel.from_pretrained(str(model_path), attn_implementation="eager")
    return model.eval()


def torch_runner(model_path: Path, threads: int, tokenizer: Any, quantize: bool) -> Runner:
    """`tokenizer` is the transformers tokenizer, asked only for the input names."""
    import torch

    model = load_torch_model(model_path, threads)
    if quantize:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    names = input_names(tokenizer)

    def run(enc: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = model(**{k: torch.from_numpy(enc[k]) for k in names})
        return out.last_hidden_state.float().numpy()

    return run


def onnx_runner(path: Path, threads: int) -> Runner:
    """A CPU session over a prepared ONNX file (see cache.embedder_export)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads > 0:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    # No busy-waiting between ops: on a shared or CPU-limited node spinning threads starve
    # everything else (measured under load, 2 threads: p50 12 ms and a 108 ms max with
    # spinning vs 5.7 ms / 24 ms without; idle, the difference is within noise).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # ALL on top of the prepared file's EXTENDED optimizations: only the layout passes for this
    # CPU are left to run at start (the prepared file stays portable across CPUs).
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(enc: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(["hidden"], {n: enc[n].astype(np.int64) for n in names})[0]

    return run
