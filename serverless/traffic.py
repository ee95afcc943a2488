"""Request arrivals: CSV traces or generators (steady, burst, diurnal, sporadic dev tenant).

A trace CSV has a header; `timestamp` is required (seconds, or ISO 8601; shifted so the first request is
at 0), and optional columns are `prompt_id`, `tenant`, `hit` (the real cache's decision: 1/0/true/false)
and `output_tokens`.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass
class Arrival:
    t: float
    prompt_id: str = ""
    tenant: str = ""
    hit: bool | None = None  # None: decided by the hit ratio
    output_tokens: int | None = None


def _poisson(
    rate_fn: Callable[[float], float], peak: float, duration: float, rng: random.Random
) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning (Lewis–Shedler): exact for any rate <= peak."""
    out: list[float] = []
    if peak <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak <= rate_fn(t):
            out.append(t)


def steady(rate: float, duration: float, rng: random.Random) -> list[Arrival]:
    return [Arrival(t) for t in _poisson(lambda _t: rate, rate, duration, rng)]


def burst(
    rate: float,
    duration: float,
    rng: random.Random,
    at: float | None = None,
    factor: float = 10.0,
    ramp: float = 5.0,
    length: float = 60.0,
) -> list[Arrival]:
    """Base `rate`, rising linearly to `factor`× within `ramp` seconds at `at`, held `length` seconds."""
    start = duration / 3 if at is None else at

    def rate_fn(t: float) -> float:
        if t < start or t > start + ramp + length:
            return rate
        if t < start + ramp:
            return rate * (1 + (factor - 1) * (t - start) / ramp)
        return rate * factor

    return [Arrival(t) for t in _poisson(rate_fn, rate * factor, duration, rng)]


def diurnal(
    rate: float, duration: float, rng: random.Random, period: float = 86400.0, trough: float = 0.1
) -> list[Arrival]:
    """Peak `rate` at mid-period, `trough`×rate at t=0 and t=period (a day compressed into `period`)."""
    low = rate * trough

    def rate_fn(t: float) -> float:
        return low + (rate - low) * 0.5 * (1 - math.cos(2 * math.pi * t / period))

    return [Arrival(t) for t in _poisson(rate_fn, rate, duration, rng)]


def sporadic(duration: float, rng: random.Random, mean_gap: float = 180.0) -> list[Arrival]:
    """A developer poking a dev tenant: one request every `mean_gap` seconds on average."""
    return [Arrival(t) for t in _poisson(lambda _t: 1 / mean_gap, 1 / mean_gap, duration, rng)]


def _timestamp(raw: str, row: int) -> float:
    raw = raw.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"trace row {row}: timestamp {raw!r} is neither seconds nor ISO 8601") from None


def _hit(raw: str | None, row: int) -> bool | None:
    if raw is None or raw.strip() == "":
        return None
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "hit"):
        return True
    if low in ("0", "false", "no", "miss"):
        return False
    raise ValueError(f"trace row {row}: hit {raw!r} is not 1/0/true/false")


def read_trace(path: Path, tenant: str | None = None) -> list[Arrival]:
    """Arrivals from a CSV, optionally only one tenant's, sorted and shifted to start at 0."""
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or "timestamp" not in reader.fieldnames:
            raise ValueError(f"{path}: a header with a 'timestamp' column is required")
        out: list[Arrival] = []
        for i, row in enumerate(reader, start=2):
            if tenant is not None and row.get("tenant", "") != tenant:
                continue
            tokens = row.get("output_tokens")
            out.append(
                Arrival(
                    t=_timestamp(row["timestamp"], i),
                    prompt_id=row.get("prompt_id", "") or "",
                    tenant=row.get("tenant", "") or "",
                    hit=_hit(row.get("hit"), i),
                    output_tokens=int(tokens) if tokens not in (None, "") else None,
                )
            )
    out.sort(key=lambda a: a.t)
    if out:
        t0 = out[0].t
        for a in out:
            a.t -= t0
    return out


def write_trace(path: Path, arrivals: list[Arrival]) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "prompt_id", "tenant", "hit", "output_tokens"])
        for a in arrivals:
            hit = "" if a.hit is None else int(a.hit)
            w.writerow([f"{a.t:.6f}", a.prompt_id, a.tenant, hit, a.output_tokens or ""])


def generate(
    kind: str,
    rate: float,
    duration: float,
    seed: int,
    *,
    burst_at: float | None = None,
    burst_factor: float = 10.0,
    burst_ramp: float = 5.0,
    burst_length: float = 60.0,
    period: float = 86400.0,
    mean_gap: float = 180.0,
) -> list[Arrival]:
    rng = random.Random(f"{seed}:traffic")
    if kind == "steady":
        return steady(rate, duration, rng)
    if kind == "burst":
        return burst(rate, duration, rng, burst_at, burst_factor, burst_ramp, burst_length)
    if kind == "diurnal":
        return diurnal(rate, duration, rng, period)
    if kind == "sporadic":
        return sporadic(duration, rng, mean_gap)
    raise ValueError(f"--traffic {kind!r}: expected steady, burst, diurnal or sporadic")
