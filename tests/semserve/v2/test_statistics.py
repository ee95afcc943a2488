"""Triton's statistics of a model (semserve/v2/statistics.py): what a request adds, as both wire
forms write it."""

from __future__ import annotations

from semserve.v2.statistics import InferenceStatistics


def test_requests_add_executions_inferences_and_times() -> None:
    stats = InferenceStatistics()
    stats.record(True, 2_000, prompts=3)
    stats.record(False, 500, prompts=1)  # a failure is timed, never counted as answered
    stats.record(True, 1_000, prompts=1)
    json = stats.json("llm")
    assert (json["execution_count"], json["inference_count"]) == (2, 4)
    inference = json["inference_stats"]
    assert inference["success"] == inference["compute_infer"] == {"count": 2, "ns": 3_000}
    assert inference["fail"] == {"count": 1, "ns": 500}
    assert inference["queue"] == {"count": 0, "ns": 0} and json["last_inference"] > 0
    # The gRPC message holds the same.
    proto = stats.proto("llm")
    assert (proto.execution_count, proto.inference_count) == (2, 4)
    assert (proto.inference_stats.success.count, proto.inference_stats.success.ns) == (2, 3_000)
    assert proto.inference_stats.fail.count == 1


def test_cache_hits_carry_their_request_s_time_and_misses_their_count() -> None:
    stats = InferenceStatistics()
    stats.cached(hits=2, misses=1, ns=300)
    stats.cached(hits=0, misses=0, ns=100)  # bypassed: neither
    inference = stats.json("llm")["inference_stats"]
    assert inference["cache_hit"] == {"count": 2, "ns": 600}
    assert inference["cache_miss"] == {"count": 1, "ns": 0}
    assert stats.proto("llm").inference_stats.cache_hit.count == 2
