"""Triton's statistics extension: what a model answered since it started, as
`GET /v2/models/{name}/stats` and the `ModelStatistics` RPC report it (tritonclient's
`get_inference_statistics`).

Each v2 request (infer, generate, ModelInfer, ModelStreamInfer) is one execution; its prompts are
its inferences (OpenAI requests are counted in the Prometheus metrics only). A request's whole time counts as
`success` (or `fail`) and as `compute_infer`: these models have no queue, input or output phases
apart from answering (the transformer's fair queue is inside its answer). On the transformer,
`cache_hit` counts the prompts the cache answered (exact or semantic) with the time of the requests
they came in, and `cache_miss` the prompts the predictor answered (its time is in `success`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from semserve.v2 import inference_pb2 as pb

# The model version these services report: none, as they serve one (a version asked for is a 400,
# as on the infer routes).
VERSION = ""


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}

    def proto(self) -> pb.StatisticDuration:
        return pb.StatisticDuration(count=self.count, ns=self.ns)


@dataclass
class InferenceStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    inference_count: int = 0  # prompts answered
    execution_count: int = 0  # requests answered
    last_inference_ms: int = 0  # wall clock of the last request's end (0: none yet)

    def record(self, ok: bool, ns: int, prompts: int) -> None:
        """One request ended: answered (`ok`) or failed, after `ns`, with `prompts` prompts."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        if not ok:
            self.fail.add(ns)
            return
        self.success.add(ns)
        self.compute_infer.add(ns)
        self.execution_count += 1
        self.inference_count += prompts

    def cached(self, hits: int, misses: int, ns: int) -> None:
        """A transformer request's prompts, by who answered them: the cache, or the predictor."""
        if hits:
            self.cache_hit.add(ns * hits, hits)
        if misses:
            self.cache_miss.add(0, misses)

    def json(self, name: str) -> dict[str, Any]:
        """One entry of the REST response's `model_stats`, as Triton writes it."""
        zero = Duration().json()
        return {
            "name": name,
            "version": VERSION,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.json(), "fail": self.fail.json(), "queue": zero,
                "compute_input": zero, "compute_infer": self.compute_infer.json(), "compute_output": zero,
                "cache_hit": self.cache_hit.json(), "cache_miss": self.cache_miss.json(),
            },
            "batch_stats": [],
        }  # fmt: skip

    def proto(self, name: str) -> pb.ModelStatistics:
        zero = Duration().proto()
        return pb.ModelStatistics(
            name=name,
            version=VERSION,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            inference_stats=pb.InferStatistics(
                success=self.success.proto(), fail=self.fail.proto(), queue=zero, compute_input=zero,
                compute_infer=self.compute_infer.proto(), compute_output=zero,
                cache_hit=self.cache_hit.proto(), cache_miss=self.cache_miss.proto(),
            ),
        )  # fmt: skip
