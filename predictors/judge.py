"""The same-answer judge: a second KServe model, `{model}-judge`, on the predictor's own engine.

Given a new prompt (`query`) and a cached one (`cached`), it asks the model, in one short prefill
and one token, whether one answer fits both, and answers P(same) = P(yes) / (P(yes) + P(no)) read
from the first token's top logprobs. The transformer uses it for cache candidates in the scorer's
grey zone (semserve/judge_protocol.py holds the names both sides use).

An adapter like the others: it parses the v2 request, asks the engine for the first token's top
logprobs of the judge's chat (Engine.first_token_logprobs, which knows nothing of judging) and
formats the probability. The engine does not import this module.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse

from semserve import v2
from semserve.errors import BadRequest, Unavailable
from semserve.errors import BadRequest as InvalidInput400
from semserve.errors import Unavailable as Unavailable503
from semserve.judge_protocol import CACHED_INPUT, PROBABILITY_OUTPUT, QUERY_INPUT, judge_model_name
from semserve.logs import get_logger
from semserve.v2.text_model import V2Model, request_id

if TYPE_CHECKING:  # only its type: the server hands the judge its engine
    from predictors.engine import Engine

log = get_logger("semserve.predictor.engine")  # the judge_finished line, beside generation_finished

SYSTEM_LINE = "You compare two questions and answer only Yes or No."
QUESTION = (
    "Question 1: {query}\nQuestion 2: {cached}\n"
    "Do these two questions ask for the same thing, so that one answer fits both? Answer Yes or No."
)
# Top logprobs read at the first position: enough that Yes and No are among them when likely.
TOP_LOGPROBS = 20
# Spellings of the answer the model may start with; only those that are one token count.
YES_WORDS = ("Yes", " Yes", "yes", " yes")
NO_WORDS = ("No", " No", "no", " no")

INPUTS_METADATA: list[dict[str, Any]] = [
    {"name": QUERY_INPUT, "datatype": "BYTES", "shape": [1]},
    {"name": CACHED_INPUT, "datatype": "BYTES", "shape": [1]},
]
OUTPUTS_METADATA: list[dict[str, Any]] = [{"name": PROBABILITY_OUTPUT, "datatype": "FP32", "shape": [1]}]


def judge_messages(query: str, cached: str) -> list[dict[str, str]]:
    """The judge's chat, in the form chat templates take."""
    return [
        {"role": "system", "content": SYSTEM_LINE},
        {"role": "user", "content": QUESTION.format(query=query, cached=cached)},
    ]


@dataclass(frozen=True)
class AnswerTokens:
    """The token ids that begin a Yes and a No answer in this model's vocabulary."""

    yes: frozenset[int]
    no: frozenset[int]

    @classmethod
    def of(cls, tokenizer: Any) -> AnswerTokens:
        def single(words: tuple[str, ...]) -> frozenset[int]:
            encoded = (tokenizer.encode(w, add_special_tokens=False) for w in words)
            return frozenset(ids[0] for ids in encoded if len(ids) == 1)

        return cls(yes=single(YES_WORDS), no=single(NO_WORDS))


def same_answer_probability(top_logprobs: Mapping[int, float], tokens: AnswerTokens) -> float:
    """P(yes) / (P(yes) + P(no)) among the first position's top tokens; 0.0 (reject) when neither
    appears, so that a model that answers something else never serves a cached answer."""
    yes = sum(math.exp(lp) for token, lp in top_logprobs.items() if token in tokens.yes)
    no = sum(math.exp(lp) for token, lp in top_logprobs.items() if token in tokens.no)
    if yes + no <= 0.0:
        return 0.0
    return min(1.0, max(0.0, yes / (yes + no)))


@dataclass(frozen=True)
class JudgeRequest:
    query: str
    cached: str


def parse_request(payload: InferRequest) -> JudgeRequest:
    unknown = [i.name for i in payload.inputs if i.name not in (QUERY_INPUT, CACHED_INPUT)]
    if unknown:
        raise BadRequest(
            f"unknown input(s) {unknown}; expected {QUERY_INPUT!r} and {CACHED_INPUT!r}", unknown[0]
        )
    return JudgeRequest(_text(payload, QUERY_INPUT), _text(payload, CACHED_INPUT))


def _text(payload: InferRequest, name: str) -> str:
    inp = payload.get_input_by_name(name)
    if inp is None:
        raise BadRequest(f"missing input {name!r} (BYTES, shape [1])", name)
    if inp.datatype != "BYTES":
        raise BadRequest(f"{name} must have datatype BYTES, got {inp.datatype}", name)
    if list(inp.shape) != [1]:
        raise BadRequest(f"{name} must have shape [1], got {list(inp.shape)}", name)
    try:
        items = list(np.asarray(inp.as_numpy(), dtype=object).reshape(-1))
    except Exception as exc:  # numpy raises several types for data that doesn't fit the shape
        raise BadRequest(f"{name}: data does not match shape [1]: {exc}", name) from None
    if len(items) != 1:
        raise BadRequest(f"{name} must hold exactly one text", name)
    # The v2 contract's decoding: UTF-8, no NUL, not blank; its errors name the input.
    return v2.decode_text(items[0], 0, name)


class SameAnswerJudge(V2Model):
    """`{model}-judge`, sharing the main model's Engine (one engine, one continuous batch)."""

    def __init__(self, model_name: str, engine: Engine) -> None:
        super().__init__(judge_model_name(model_name))
        self.llm = engine
        self._answer_tokens: AnswerTokens | None = None  # read off the tokenizer once it is loaded

    def load(self) -> bool:
        # Registered at once; healthy (and so ready) only once the shared engine is up.
        self.ready = True
        return self.ready

    async def healthy(self) -> bool:
        return self.ready and await self.llm.healthy()

    async def get_input_types(self) -> list[dict[str, Any]]:
        return INPUTS_METADATA

    async def get_output_types(self) -> list[dict[str, Any]]:
        return OUTPUTS_METADATA

    async def infer(self, payload: InferRequest, headers: dict[str, str]) -> InferResponse:
        if not self.llm.ready:
            raise Unavailable503(f"model {self.name} is not ready: the engine is still starting")
        rid = request_id(payload, headers)
        try:
            request = parse_request(payload)
            probability = await self.same_answer(request.query, request.cached, rid)
        except BadRequest as exc:
            raise InvalidInput400(exc.message, exc.field) from None
        except Unavailable as exc:
            raise Unavailable503(exc.message) from None
        # FP32 on the wire (gRPC's raw contents); the same float32 value over REST.
        value = float(np.float32(probability))
        return InferResponse(
            response_id=rid,
            model_name=self.name,
            infer_outputs=[InferOutput(PROBABILITY_OUTPUT, [1], "FP32", [value])],
        )

    async def same_answer(self, query: str, cached: str, rid: str = "") -> float:
        """P(one answer fits both questions), from the first token's top logprobs of the judge chat:
        one prefill and one token, in the same batch as every generation."""
        started = time.monotonic()
        prompt = self.llm.render_messages(judge_messages(query, cached))
        ids = await self.llm.tokens(prompt)
        if len(ids) + 1 > self.llm.max_model_len:
            longer = QUERY_INPUT if len(query) >= len(cached) else CACHED_INPUT
            raise BadRequest(
                f"the judge prompt of {QUERY_INPUT} and {CACHED_INPUT} has "
                f"{len(ids)} tokens; the model's context is {self.llm.max_model_len} tokens",
                longer,
            )
        first = await self.llm.first_token_logprobs(ids, rid or "judge", TOP_LOGPROBS)
        if self._answer_tokens is None:
            self._answer_tokens = AnswerTokens.of(self.llm.tokenizer)
        probability = same_answer_probability(first.logprobs, self._answer_tokens)
        log.info(
            "judge_finished",
            request_id=rid,
            engine_request_id=first.engine_request_id,
            prompt_tokens=first.prompt_tokens,
            probability=round(probability, 4),
            seconds=round(time.monotonic() - started, 4),
        )
        return probability
