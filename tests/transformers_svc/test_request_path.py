"""The transformer's request path in process, without a predictor: the context made once at the
edge, the cache decision it drives, and the request log as a listener."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from kserve import InferInput, InferRequest

from semserve import openai_protocol as oa
from semserve import openai_routes
from semserve.answer import Answer, Piece, answer_of
from semserve.errors import BadRequest, Unavailable
from semserve.sampling import SamplingOptions
from semserve.v2.text_model import request_id
from transformers_svc.answer_pipeline import AnswerPipeline, hit_answer
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.request_context import (
    RequestContext,
    RequestRecord,
    openai_context,
    status_of,
    v2_context,
)
from transformers_svc.request_log import RequestLog, prompt_hash


def _infer(prompts: list[str], rid: str | None = None) -> InferRequest:
    inp = InferInput("text_input", [len(prompts)], "BYTES")
    inp.set_data_from_numpy(np.array([p.encode() for p in prompts], dtype=object))
    return InferRequest("llm", infer_inputs=[inp], request_id=rid, parameters={"max_tokens": 3})


def test_v2_context_is_made_once_from_the_request() -> None:
    payload = _infer(["hi"])
    headers = {"X-Request-Id": "abc", "Cache-Control": "no-store, No-Cache"}
    ctx = v2_context(payload, headers, model="llm", default_tenant="dflt", route="/v2/models/llm/infer")
    assert (ctx.tenant, ctx.request_id, ctx.protocol) == ("dflt", "abc", "v2-rest")
    assert ctx.cache_control == {"no-store", "no-cache"}
    assert request_id(_infer(["hi"], rid="body-id"), headers) == "body-id"
    token = tenant_var.set("acme")
    try:
        assert v2_context(payload, {}, model="llm", default_tenant="dflt", route="/x").tenant == "acme"
    finally:
        tenant_var.reset(token)
    sampled = ctx.with_sampling(SamplingOptions(temperature=0))
    assert sampled.sampling.temperature == 0
    assert sampled.request_id == "abc" and sampled.started == ctx.started


def test_openai_context() -> None:
    http = openai_routes.OpenAIHttpCall(request_id="r1", headers={"cache-control": "no-cache"})
    ctx = openai_context(http, model="llm", default_tenant="t", route="/openai/v1/completions")
    assert (ctx.tenant, ctx.request_id, ctx.protocol) == ("t", "r1", "openai")
    assert ctx.cache_control == {"no-cache"}


def test_cache_mode_follows_the_context() -> None:
    front = AnswerPipeline(TransformerSettings(), cache=None, predictor=None)  # type: ignore[arg-type]
    ctx = RequestContext("t", "r", "openai", "/x", frozenset(), SamplingOptions(temperature=0))
    assert not front.mode(ctx).used  # no cache configured
    front.cache = object()  # type: ignore[assignment]
    assert front.mode(ctx).read and front.mode(ctx).write
    no_store = RequestContext("t", "r", "openai", "/x", frozenset({"no-store"}), ctx.sampling)
    assert front.mode(no_store).read and not front.mode(no_store).write
    sampled = RequestContext("t", "r", "openai", "/x", frozenset(), SamplingOptions(temperature=0.7))
    assert not front.mode(sampled).used  # the default policy caches deterministic requests only
    key = front.key(ctx, "completion", "hello")
    assert key.tenant == "t" and key.sampling.temperature == 0


def test_answers_are_typed() -> None:
    pieces = [Piece("Hel", None, 1, 4, None), Piece("lo", "stop", 2, 4, "rev1")]
    assert answer_of(pieces) == Answer("Hello", "stop", 2, 4, "rev1")
    assert answer_of([]) == Answer("", "", 0, 0) and not answer_of([]).complete
    assert hit_answer(None) is None


def test_status_of() -> None:
    assert status_of(BadRequest("no")) == 400 and status_of(Unavailable("down")) == 503
    assert status_of(BadRequest("no")) == 400 and status_of(RuntimeError()) == 500
    assert status_of(GeneratorExit()) == 499


def test_request_log_listens_to_records(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, full=True)
    ctx = RequestContext("acme", "rid-1", "openai", "/openai/v1/chat/completions", frozenset())
    body = oa.ChatCompletionRequest.model_validate(
        {"model": "llm", "messages": [{"role": "user", "content": "hi there"}]}
    )
    log.on_outcome(RequestRecord(ctx, 200, ["hi there"], ["miss"], ["Hello"], body=body))
    log.on_outcome(RequestRecord.failed(ctx, BadRequest("bad"), ["hi there"]))
    ok, failed = [json.loads(line) for line in path.read_text().splitlines()]
    assert ok["tenant"] == "acme" and ok["request_id"] == "rid-1" and ok["cache"] == ["miss"]
    assert ok["prompt_sha256"] == [prompt_hash("hi there")] and ok["response"] == {"texts": ["Hello"]}
    assert ok["request"]["body"]["messages"][0]["content"] == "hi there"
    assert failed["status"] == 400 and failed["error"] == "bad"
    assert failed["request"] == {"prompts": ["hi there"]}
    hashed = RequestLog(tmp_path / "h.jsonl")
    hashed.on_outcome(RequestRecord(ctx, 200, ["hi there"], ["miss"], ["Hello"], body=body))
    line = json.loads((tmp_path / "h.jsonl").read_text())
    assert "request" not in line and "response" not in line


def test_choices_share_greedy_answers_seed_apart_and_draw_apart() -> None:
    def ctx(sampling: SamplingOptions) -> RequestContext:
        return RequestContext("t", "r", "openai", "/x", frozenset({"no-transform"}), sampling)

    greedy = ctx(SamplingOptions(temperature=0)).choices(3)
    assert len({c.sampling for c in greedy}) == 1
    assert {c.cache_control for c in greedy} == {frozenset({"no-transform"})}
    seeded = ctx(SamplingOptions(temperature=0.8, seed=5)).choices(3)
    assert [c.sampling.seed for c in seeded] == [5, 6, 7]
    assert {c.cache_control for c in seeded} == {frozenset({"no-transform"})}  # each its own cache entry
    drawn = ctx(SamplingOptions(temperature=0.8)).choices(3)
    assert drawn[0].cache_control == frozenset({"no-transform"})
    assert all({"no-cache", "no-store"} <= c.cache_control for c in drawn[1:])
