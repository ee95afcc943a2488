"""The cache's same-answer judge (cache.interfaces.Judge) backed by the predictor's own model: the
predictor serves it as a second KServe model (semserve.judge_protocol), one short prefill and one
token per question. Chosen with --cache-judge predictor; errors propagate, and the cache rejects on
them (cache/judge_step.py).
"""

from __future__ import annotations

import uuid

from transformers_svc.predictor_client import PredictorClient


class PredictorJudge:
    """Implements cache.interfaces.Judge over the transformer's existing gRPC channel."""

    def __init__(self, client: PredictorClient) -> None:
        self.client = client

    async def same_answer(self, query: str, cached: str) -> float:
        # A fresh id per call: the judge call is the cache's, not the client request's.
        return await self.client.judge(query, cached, uuid.uuid4().hex)
