"""OpenAI completions and chat over the shared engine (the routes themselves live in semserve/).

An adapter: it checks the request, calls the engine's one generation path (predictors/engine.py)
and formats answers or pieces as OpenAI objects and chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from predictors.config import PredictorSettings
from predictors.engine import Engine, Prepared
from semserve import openai_protocol as oa
from semserve import tracing
from semserve.answer import Piece, answer_of
from semserve.errors import NotFound
from semserve.openai_format import ChatFormatter, CompletionFormatter, Formatter
from semserve.openai_routes import MODEL_REVISION_HEADER, OpenAIHttpCall
from semserve.streams import merge_streams

PROTOCOL = "openai"



class PredictorOpenAI:
    def __init__(self, settings: PredictorSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.name = settings.model_name

    def models(self) -> list[oa.OpenAIModelCard]:
        return [oa.model_card(self.name, int(self.engine.started_at or 0))]

    def _label(self, ctx: OpenAIHttpCall) -> None:
        # Streams too: the routes send ctx.response_headers before the first chunk.
        if self.settings.model_revision:
            ctx.response_headers[MODEL_REVISION_HEADER] = self.settings.model_revision

    def _check_model(self, model: str) -> None:
        tracing.annotate(semserve__protocol=PROTOCOL, gen_ai__request__model=model)
        if model != self.name:
            raise NotFound(f"model {model!r} not found; this server serves {self.name!r}", "model")

    async def completions(
        self, req: oa.CompletionRequest, ctx: OpenAIHttpCall
    ) -> oa.Completion | AsyncIterator[oa.Completion]:
        self._check_model(req.model)
        options = req.sampling(self.settings.default_max_tokens)
        prompts = req.prompts
        req.check_choices(len(prompts), self.settings.max_batch_size)
        # Prompt by prompt, its n choices together (vLLM's order: choice index = prompt * n + j).
        prepared = [await self.engine.prepare(p, o) for p in prompts for o in req.choices(options)]
        fmt = CompletionFormatter(self.name, oa.new_id("cmpl"), oa.now(), req.usage_report, req.echoes())
        self._label(ctx)
        if req.stream:
            return self._stream(prepared, fmt, ctx, "text_completion")
        return fmt.whole(await self.engine.answers(prepared, ctx.request_id, PROTOCOL))

    async def chat_completions(
        self, req: oa.ChatCompletionRequest, ctx: OpenAIHttpCall
    ) -> oa.ChatCompletion | AsyncIterator[oa.ChatCompletionChunk]:
        self._check_model(req.model)
        options = req.sampling(self.settings.default_max_tokens)
        prompt = self.engine.render_chat(req.prompt())
        req.check_choices(1, self.settings.max_batch_size)
        prepared = [await self.engine.prepare(prompt, o, field="messages") for o in req.choices(options)]
        tools = req.prompt().tool_use()
        fmt = ChatFormatter(self.name, oa.new_id("chatcmpl"), oa.now(), req.usage_report, req.n, tools)
        self._label(ctx)
        if req.stream:
            return self._stream(prepared, fmt, ctx, "chat")
        return fmt.whole(await self.engine.answers(prepared, ctx.request_id, PROTOCOL, "chat"))

    async def _stream(
        self, prepared: list[Prepared], fmt: Formatter, ctx: OpenAIHttpCall, operation: str
    ) -> AsyncIterator[Any]:
        """Every choice's pieces as they come, each chunk naming its choice."""
        # Each choice's latest piece: its counts so far (before the first, the prompt's alone).
        latest = [Piece("", None, 0, len(p.token_ids)) for p in prepared]
        for i, before in enumerate(latest):
            opening = fmt.start(before, i)
            if opening is not None:
                yield opening
        one = len(prepared) == 1
        async for index, piece in merge_streams([
            self.engine.generate(p, ctx.request_id if one else f"{ctx.request_id}-{i}", PROTOCOL, operation)
            for i, p in enumerate(prepared)
        ]):
            latest[index] = piece
            for chunk in fmt.piece(piece, index):
                yield chunk
        if fmt.usage_report.final:
            yield fmt.total_usage([answer_of([piece]) for piece in latest])
