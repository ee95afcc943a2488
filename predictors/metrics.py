"""Predictor metrics beside KServe's request histograms and vLLM's own vllm:* series."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# `model_name`, as KServe's request_*_seconds and vLLM's vllm:* series label the model, so one
# dashboard variable and one `by (model_name)` join all three.
LABELS = ("model_name", "protocol")

# Buckets span a CPU engine's first token (hundreds of ms) down to a GPU's (ms).
TTFT = Histogram(
    "semserve_predictor_time_to_first_token_seconds",
    "Time from request arrival to its first generated token.",
    LABELS,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ITL = Histogram(
    "semserve_predictor_inter_token_latency_seconds",
    "Time between consecutive generated tokens of one request.",
    LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
REQUEST_LATENCY = Histogram(
    "semserve_predictor_request_duration_seconds",
    "Time to generate a whole completion.",
    LABELS,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
PROMPT_TOKENS = Counter("semserve_predictor_prompt_tokens_total", "Prompt tokens admitted.", LABELS)
COMPLETION_TOKENS = Counter(
    "semserve_predictor_completion_tokens_total", "Tokens generated.", LABELS
)
REQUESTS = Counter(
    "semserve_predictor_generations_total", "Generations by outcome.", (*LABELS, "outcome")
)
IN_FLIGHT = Gauge("semserve_predictor_requests_in_flight", "Generations running now.", LABELS)
ABORTED = Counter(
    "semserve_predictor_requests_aborted_total",
    "Generations aborted because the client went away (the engine stops working on them).",
    LABELS,
)
# The sleep tier (predictors/sleep.py; GPU only): the engine's state and how long each wake took.
SLEEP_STATE = Gauge(
    "semserve_predictor_sleep_state",
    "1 while the engine sleeps (vLLM sleep mode: weights in host memory, KV cache freed), else 0.",
    ("model_name",),
)
WAKE_SECONDS = Histogram(
    "semserve_predictor_wake_seconds",
    "Time for the sleeping engine to wake (weights back to the accelerator, KV cache reallocated).",
    ("model_name",),
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 60),
)
