"""The transformer's predictor-call outcomes are a small fixed set, whatever the exception."""

from __future__ import annotations

import asyncio

import grpc
from grpc.aio import AioRpcError, Metadata

from semserve.errors import BadRequest, NotFound, PayloadTooLarge, ServingError, Unavailable
from transformers_svc import metrics


def _rpc(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details="x")


def test_outcome_of_maps_to_the_fixed_set() -> None:
    cases = {
        BadRequest("max_tokens too large", "max_tokens"): "client_error",
        NotFound("no model", "model"): "client_error",
        PayloadTooLarge("too big"): "client_error",
        Unavailable("predictor down"): "unavailable",
        ServingError("boom"): "error",
        _rpc(grpc.StatusCode.INVALID_ARGUMENT): "client_error",
        _rpc(grpc.StatusCode.UNAVAILABLE): "unavailable",
        _rpc(grpc.StatusCode.DEADLINE_EXCEEDED): "unavailable",
        _rpc(grpc.StatusCode.CANCELLED): "cancelled",
        _rpc(grpc.StatusCode.INTERNAL): "error",
        asyncio.CancelledError(): "cancelled",
        ConnectionRefusedError(): "unavailable",
        RuntimeError("bug"): "error",
    }
    for exc, expected in cases.items():
        assert metrics.outcome_of(exc) == expected, exc
        assert expected in metrics.OUTCOMES
    # Before: the label was the class name, e.g. outcome="BadRequest" beside "ok".
    assert "BadRequest" not in metrics.OUTCOMES


def test_metrics_label_the_model_model_name() -> None:
    """As KServe's request_*_seconds and vLLM's vllm:* do, so one `by (model_name)` joins them."""
    from prometheus_client.metrics import MetricWrapperBase

    import predictors.metrics as pm

    for module in (pm, metrics):
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase):
                assert "model" not in obj._labelnames and "model_name" in obj._labelnames, obj
