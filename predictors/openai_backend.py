"""OpenAI completions and chat over the shared engine (the routes themselves live in semserve/).

An adapter: it checks the request, calls the engine's one generation path (predictors/engine.py)
and formats answers or pieces as OpenAI objects and chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from predictors.config import PredictorSettings
from predictors.engine import Engine, Prepared
from semserve import openai_protocol as oa
from semserve import tracing
from semserve.errors import NotFound
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
        rid, created = oa.new_id("cmpl"), oa.now()
        self._label(ctx)
        if req.stream:
            return self._stream_completion(prepared, req.n, rid, created, ctx, req.usage_report, req.echoes())
        answers = await self.engine.answers(prepared, ctx.request_id, PROTOCOL)
        echo = req.echoes()
        return oa.completion(
            rid,
            self.name,
            created,
            [echo.whole(i, a.text) for i, a in enumerate(answers)],
            [a.finish_reason for a in answers],
            sum(a.prompt_tokens for a in answers[:: req.n]),  # each prompt once, as vLLM counts
            sum(a.completion_tokens for a in answers),
        )

    async def _stream_completion(
        self,
        prepared: list[Prepared],
        n: int,
        rid: str,
        created: int,
        ctx: OpenAIHttpCall,
        usage: oa.UsageReport,
        echo: oa.Echo,
    ) -> AsyncIterator[oa.Completion]:
        prompt_tokens = sum(len(p.token_ids) for p in prepared[::n])  # each prompt once, as vLLM counts
        completion_tokens = [0] * len(prepared)
        async for index, piece in merge_streams(
            [self.engine.generate(p, f"{ctx.request_id}-{i}", PROTOCOL) for i, p in enumerate(prepared)]
        ):
            completion_tokens[index] = piece.completion_tokens
            so_far = usage.so_far(piece.prompt_tokens, piece.completion_tokens)
            text = echo.piece(index, piece.text)
            yield oa.completion_chunk(rid, self.name, created, index, text, piece.finish_reason, so_far)
        if usage.final:
            yield oa.completion_usage_chunk(rid, self.name, created, prompt_tokens, sum(completion_tokens))

    async def chat_completions(
        self, req: oa.ChatCompletionRequest, ctx: OpenAIHttpCall
    ) -> oa.ChatCompletion | AsyncIterator[oa.ChatCompletionChunk]:
        self._check_model(req.model)
        options = req.sampling(self.settings.default_max_tokens)
        prompt = self.engine.render_chat(req.prompt())
        req.check_choices(1, self.settings.max_batch_size)
        prepared = [await self.engine.prepare(prompt, o, field="messages") for o in req.choices(options)]
        rid, created = oa.new_id("chatcmpl"), oa.now()
        self._label(ctx)
        if req.stream:
            return self._stream_chat(prepared, rid, created, ctx, req.usage_report)
        answers = await self.engine.answers(prepared, ctx.request_id, PROTOCOL, "chat")
        return oa.chat_completion(
            rid,
            self.name,
            created,
            [a.text for a in answers],
            [a.finish_reason for a in answers],
            answers[0].prompt_tokens,
            sum(a.completion_tokens for a in answers),
        )

    async def _stream_chat(
        self, prepared: list[Prepared], rid: str, created: int, ctx: OpenAIHttpCall, usage: oa.UsageReport
    ) -> AsyncIterator[oa.ChatCompletionChunk]:
        prompt_tokens = len(prepared[0].token_ids)  # one prompt, its n choices

        def chunk(index: int, content: str | None, finish_reason: str | None = None, *, role: bool = False,
                  completion_tokens: int = 0) -> oa.ChatCompletionChunk:  # fmt: skip
            so_far = usage.so_far(prompt_tokens, completion_tokens)
            return oa.chat_chunk(rid, self.name, created, content, finish_reason, role, so_far, usage.final,
                                 index=index)  # fmt: skip

        # OpenAI sends each choice's role first, in a chunk of its own with empty content.
        for index in range(len(prepared)):
            yield chunk(index, "", role=True)
        completion_tokens = [0] * len(prepared)
        one = len(prepared) == 1
        async for index, piece in merge_streams([
            self.engine.generate(p, ctx.request_id if one else f"{ctx.request_id}-{i}", PROTOCOL, "chat")
            for i, p in enumerate(prepared)
        ]):
            completion_tokens[index] = piece.completion_tokens
            if piece.text:
                yield chunk(index, piece.text, completion_tokens=piece.completion_tokens)
            if piece.finish_reason:
                yield chunk(index, None, piece.finish_reason, completion_tokens=piece.completion_tokens)
        if usage.final:
            yield oa.chat_usage_chunk(rid, self.name, created, prompt_tokens, sum(completion_tokens))
