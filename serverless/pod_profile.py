"""The predictor pod as the simulation sees it: a startup-delay distribution and a batch-aware engine.

A profile is JSON, the format `semserve bench predictor` saves (serverless/profiles/*.json ship here):

    {"name": "...", "concurrency": [1, 8, 32], "tokens_per_s": [60, 300, 500], "ttft_s": [0.2, 0.6, 1.6],
     "max_num_seqs": 32,                                     # optional: engine batch limit
     "startup": {"schedule_s": [1, 3], "image_pull_s": [0, 0], "image_cached_probability": 1.0,
                 "model_load_s": [5, 15], "warmup_s": [25, 70]},   # optional: [low, high] uniform ranges
     "source": "..."}                                        # optional: where the figures come from

`tokens_per_s[i]` is the engine's aggregate decode throughput with `concurrency[i]` requests running;
each running request decodes at T(n)/n, linear between points and flat past the last one (saturation).
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StartupModel:
    """Pod creation to ready: scheduling + image pull (skipped when cached on the node) + model load +
    engine warm-up (torch.compile, CUDA graphs, first forward). Each part uniform in [low, high]."""

    schedule_s: tuple[float, float] = (1.0, 3.0)
    image_pull_s: tuple[float, float] = (0.0, 0.0)
    image_cached_probability: float = 1.0
    model_load_s: tuple[float, float] = (0.0, 0.0)
    warmup_s: tuple[float, float] = (30.0, 85.0)

    def draw(self, rng: random.Random) -> float:
        total = rng.uniform(*self.schedule_s)
        if rng.random() >= self.image_cached_probability:
            total += rng.uniform(*self.image_pull_s)
        total += rng.uniform(*self.model_load_s)
        total += rng.uniform(*self.warmup_s)
        return total

    def bounds(self) -> tuple[float, float]:
        """Shortest and longest possible startup."""
        pull_lo = self.image_pull_s[0] if self.image_cached_probability <= 0.0 else 0.0
        pull_hi = self.image_pull_s[1] if self.image_cached_probability < 1.0 else 0.0
        low = self.schedule_s[0] + pull_lo + self.model_load_s[0] + self.warmup_s[0]
        high = self.schedule_s[1] + pull_hi + self.model_load_s[1] + self.warmup_s[1]
        return low, high

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StartupModel:
        def rng(key: str, default: tuple[float, float]) -> tuple[float, float]:
            v = d.get(key)
            if v is None:
                return default
            lo, hi = float(v[0]), float(v[1])
            if lo < 0 or hi < lo:
                raise ValueError(f"startup.{key}: [{lo}, {hi}] must be 0 <= low <= high")
            return lo, hi

        base = cls()
        p = float(d.get("image_cached_probability", base.image_cached_probability))
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"startup.image_cached_probability: {p} is outside [0, 1]")
        return cls(
            schedule_s=rng("schedule_s", base.schedule_s),
            image_pull_s=rng("image_pull_s", base.image_pull_s),
            image_cached_probability=p,
            model_load_s=rng("model_load_s", base.model_load_s),
            warmup_s=rng("warmup_s", base.warmup_s),
        )


@dataclass
class EngineProfile:
    name: str
    concurrency: list[int]
    tokens_per_s: list[float]
    ttft_s: list[float]
    max_num_seqs: int = 256
    startup: StartupModel = field(default_factory=StartupModel)
    source: str = ""
    # What a pod holds: "gpu" (its seconds are GPU-seconds) or "cpu" (pod-seconds; a CPU profile
    # billed as GPU time would mislead whoever reads the output).
    accelerator: str = "gpu"

    def __post_init__(self) -> None:
        n = len(self.concurrency)
        if n == 0 or len(self.tokens_per_s) != n or len(self.ttft_s) != n:
            raise ValueError(
                "profile: concurrency, tokens_per_s and ttft_s must be non-empty and equally long"
            )
        if any(b <= a for a, b in zip(self.concurrency, self.concurrency[1:], strict=False)):
            raise ValueError("profile.concurrency: must be strictly increasing")
        if (
            self.concurrency[0] < 1
            or any(t <= 0 for t in self.tokens_per_s)
            or any(t < 0 for t in self.ttft_s)
        ):
            raise ValueError("profile: concurrency >= 1, tokens_per_s > 0 and ttft_s >= 0 required")
        if self.max_num_seqs < 1:
            raise ValueError("profile.max_num_seqs: must be >= 1")
        if self.accelerator not in ("gpu", "cpu"):
            raise ValueError(f"profile.accelerator: {self.accelerator!r} is not 'gpu' or 'cpu'")

    def _interp(self, ys: list[float], n: float, proportional_below: bool = False) -> float:
        xs = self.concurrency
        if n <= xs[0]:
            # Below the first measured point throughput shrinks with the batch; latency does not.
            return ys[0] * (n / xs[0]) if proportional_below else ys[0]
        if n >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, n)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    def aggregate_tokens_per_s(self, running: int) -> float:
        return self._interp(self.tokens_per_s, running, proportional_below=True) if running > 0 else 0.0

    def per_request_tokens_per_s(self, running: int) -> float:
        """Decode speed of each of `running` requests sharing the engine."""
        return self.aggregate_tokens_per_s(running) / running if running > 0 else 0.0

    def ttft(self, running: int) -> float:
        return self._interp(self.ttft_s, max(1, running))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["startup"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["startup"].items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineProfile:
        for key in ("concurrency", "tokens_per_s", "ttft_s"):
            if key not in d:
                raise ValueError(f"profile: missing {key!r}")
        return cls(
            name=str(d.get("name", "profile")),
            concurrency=[int(x) for x in d["concurrency"]],
            tokens_per_s=[float(x) for x in d["tokens_per_s"]],
            ttft_s=[float(x) for x in d["ttft_s"]],
            max_num_seqs=int(d.get("max_num_seqs", 256)),
            startup=StartupModel.from_dict(d.get("startup") or {}),
            source=str(d.get("source", "")),
            accelerator=str(d.get("accelerator", "gpu")),
        )


# The shipped profiles are data only: serverless/profiles/NAME.json, where each file says where its
# figures come from ("source"). `--profile cpu` and `--profile gpu` name two of them.
PROFILE_DIR = Path(__file__).parent / "profiles"


def shipped_profiles() -> list[str]:
    """Names `--profile` takes besides a path: the stems of serverless/profiles/*.json."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> EngineProfile:
    """A shipped profile by name (`cpu`, `gpu`, ...) or a JSON file."""
    key = str(name_or_path)
    shipped = PROFILE_DIR / f"{key}.json"
    path = shipped if "/" not in key and shipped.is_file() else Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"--profile {key}: not 'cpu', 'gpu' or an existing JSON file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--profile {path}: not JSON ({e})") from e
    return EngineProfile.from_dict(data)
