"""What a simulation run reports: the summary, the series over time, the aligned table and the plot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serverless.pods import Request, RequestState

SERIES_KEYS = (
    "t", "in_flight", "activator_queue", "pods_desired", "pods_ready", "pods_total",
    "decider_desired", "panic", "excess_burst_capacity", "activator_in_path",
    "stable_concurrency", "panic_concurrency",
)  # fmt: skip


_IN_FLIGHT = (RequestState.HELD, RequestState.QUEUED, RequestState.PREFILL, RequestState.DECODE)


@dataclass
class SimResult:
    summary: dict[str, Any]
    series: dict[str, list[float]]
    latencies: list[tuple[float, float, bool]]  # (completion time, latency, was a cache hit)
    settings: dict[str, Any]
    profile: dict[str, Any]


@dataclass
class RunStats:
    """Counted while the simulation runs (everything else is read off the requests at the end)."""

    cold_starts: int = 0
    cold_waits: list[float] = field(default_factory=list)
    peak_pods: int = 0
    peak_ready: int = 0
    pods_created: int = 0
    time_at_zero: float = 0.0
    panic_seconds: float = 0.0
    gpu_seconds: float = 0.0


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(
    reqs: list[Request], stats: RunStats, duration: float, transformer_overhead_s: float
) -> tuple[dict[str, Any], list[tuple[float, float, bool]]]:
    """(summary, latencies) of a finished run."""
    overhead = transformer_overhead_s
    served = [r for r in reqs if r.state == RequestState.DONE and r.done is not None]
    lat_all = [(r.done - r.arrival) + (0.0 if r.hit else overhead) for r in served if r.done]
    lat_pred = [(r.done - r.arrival) + overhead for r in served if not r.hit and r.done]
    ttft = [r.first_token - r.arrival + overhead for r in served if r.first_token]
    misses = [r for r in reqs if not r.hit]
    cold_ttft = [r.first_token - r.arrival + overhead for r in misses if r.cold and r.first_token]
    summary: dict[str, Any] = {
        "requests": len(reqs),
        "cache_hits": sum(1 for r in reqs if r.hit),
        "predictor_requests": len(misses),
        "served": len(served),
        "timed_out": sum(1 for r in reqs if r.state == RequestState.TIMED_OUT),
        "rejected": sum(1 for r in reqs if r.state == RequestState.REJECTED),
        "unfinished": sum(1 for r in reqs if r.state in _IN_FLIGHT),
        "latency_p50_s": percentile(lat_all, 50),
        "latency_p99_s": percentile(lat_all, 99),
        "predictor_latency_p50_s": percentile(lat_pred, 50),
        "predictor_latency_p99_s": percentile(lat_pred, 99),
        "ttft_p99_s": percentile(ttft, 99),
        "cold_starts": stats.cold_starts,
        "cold_start_requests": sum(1 for r in misses if r.cold),
        "cold_start_wait_max_s": max(stats.cold_waits) if stats.cold_waits else None,
        # What a user who arrives after an idle spell waits for: the pod's start plus the first
        # token (profile startup phases + TTFT), request arrival to first token.
        "first_answer_after_idle_p50_s": percentile(cold_ttft, 50),
        "first_answer_after_idle_max_s": max(cold_ttft) if cold_ttft else None,
        "peak_pods": stats.peak_pods,
        "peak_ready_pods": stats.peak_ready,
        "pods_created": stats.pods_created,
        "time_at_zero_s": stats.time_at_zero,
        "panic_s": stats.panic_seconds,
        "gpu_seconds": stats.gpu_seconds,
        "duration_s": duration,
    }
    latencies = [
        (r.done, (r.done - r.arrival) + (0.0 if r.hit else overhead), r.hit)
        for r in served
        if r.done is not None
    ]
    return summary, latencies


_ROWS: list[tuple[str, str]] = [
    ("requests", "requests"),
    ("cache_hits", "cache hits (served by the transformer)"),
    ("predictor_requests", "sent to the predictor"),
    ("served", "served"),
    ("timed_out", "timed out (503)"),
    ("rejected", "rejected, queue full (503)"),
    ("unfinished", "still in flight at the end"),
    ("latency_p50_s", "latency p50 (s)"),
    ("latency_p99_s", "latency p99 (s)"),
    ("predictor_latency_p50_s", "predictor latency p50 (s)"),
    ("predictor_latency_p99_s", "predictor latency p99 (s)"),
    ("cold_starts", "cold starts (from zero ready pods)"),
    ("cold_start_requests", "requests that waited for a cold start"),
    ("cold_start_wait_max_s", "longest cold-start wait (s)"),
    ("first_answer_after_idle_p50_s", "first answer after idle p50 (s)"),
    ("first_answer_after_idle_max_s", "first answer after idle max (s)"),
    ("peak_pods", "peak pods"),
    ("pods_created", "pods created"),
    ("time_at_zero_s", "time at zero pods (s)"),
    ("panic_s", "time in panic mode (s)"),
    ("gpu_seconds", "GPU-seconds"),
    ("gpu_seconds_saved_by_cache", "GPU-seconds saved by the cache"),
    ("gpu_seconds_saved_by_scale_to_zero", "GPU-seconds saved by scale-to-zero"),
]


def format_summary(summary: dict[str, Any], accelerator: str = "gpu") -> str:
    """The summary as aligned rows. A CPU profile's pods hold no GPU: their seconds are labelled
    pod-seconds (the JSON keys stay `gpu_seconds*`, so scripts reading them do not break)."""

    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}"

    unit = "GPU-seconds" if accelerator == "gpu" else "pod-seconds"
    rows = [(key, label.replace("GPU-seconds", unit)) for key, label in _ROWS]
    width = max(len(label) for _, label in rows)
    return "\n".join(f"{label:<{width}}  {fmt(summary.get(key))}" for key, label in rows)


def plot(result: SimResult, path: Path, title: str = "") -> Path:
    """Four panels over time: in flight, pods desired/ready, activator queue, latency."""
    import matplotlib.pyplot as plt

    fig = figure(result, title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure(result: SimResult, title: str = "") -> Any:
    """The matplotlib Figure that `plot` saves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    se = result.series
    t = se["t"]
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    ax = axes[0]
    ax.plot(t, se["in_flight"], lw=0.8, label="requests in flight (predictor)")
    ax.plot(t, se["stable_concurrency"], lw=0.8, ls="--", label="stable window avg")
    ax.plot(t, se["panic_concurrency"], lw=0.8, ls=":", label="panic window avg")
    ax.set_ylabel("concurrency")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    ax.step(t, se["pods_desired"], where="post", lw=1.0, label="pods desired (Deployment)")
    ax.step(t, se["pods_ready"], where="post", lw=1.0, label="pods ready")
    ax.step(t, se["pods_total"], where="post", lw=0.6, alpha=0.6, label="pods existing")
    panic_t = [x for x, p in zip(t, se["panic"], strict=False) if p]
    if panic_t:
        ax.scatter(panic_t, [0] * len(panic_t), s=2, c="red", label="panic mode")
    ax.set_ylabel("pods")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    ax.plot(t, se["activator_queue"], lw=0.8, c="tab:purple", label="held in activator")
    ax.fill_between(t, 0, [v * max(1, max(se["activator_queue"] or [1])) for v in se["activator_in_path"]],
                    step="post", alpha=0.08, color="gray", label="activator in path")  # fmt: skip
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[3]
    hits = [(d, lat) for d, lat, h in result.latencies if h]
    miss = [(d, lat) for d, lat, h in result.latencies if not h]
    # Counts in the legend: every hit takes the same 20 ms, so hits a few seconds apart are one
    # dot at this scale (a plot with 5 hits showed 4); the legend gives the summary's number.
    if miss:
        ax.scatter([d for d, _ in miss], [lat for _, lat in miss], s=3,
                   label=f"predictor ({len(miss)} served)")  # fmt: skip
    if hits:
        ax.scatter([d for d, _ in hits], [lat for _, lat in hits], s=3, c="tab:green",
                   label=f"cache hit ({len(hits)})")  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylabel("latency (s)")
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title or f"{result.settings['name']} ({result.profile['name']})")
    fig.tight_layout()
    return fig
