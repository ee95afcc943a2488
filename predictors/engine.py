"""vLLM's AsyncLLM behind one small interface every protocol uses: prepare a prompt, then generate.

`generate` is the one generation path: it yields the answer's Pieces (semserve.answer) as the engine
makes them, with the metrics, the span and the `generation_finished` log line. A whole answer is
that stream consumed (`answer`, `answers`). The protocol adapters (predictors/model.py for v2,
predictors/openai_backend.py for OpenAI) only parse, call these and format; the judge
(predictors/judge.py) uses `first_token_logprobs`, which knows nothing of judging.

All protocols share this one engine, so requests from v2 REST, v2 gRPC and OpenAI join the same
continuous batch; nothing here serializes them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from predictors import metrics, warm_start
from predictors.config import PredictorSettings
from predictors.inproc_engine import InprocLLM
from predictors.sleep import SleepControl
from semserve import stream_interval, tracing
from semserve.answer import Answer, Logprobs, Piece, TokenLogprob, answer_of
from semserve.errors import BadRequest, Unavailable
from semserve.logs import get_logger
from semserve.openai_protocol import ChatPrompt, TokenPrompt
from semserve.sampling import SamplingOptions

log = get_logger("semserve.predictor.engine")

# KV cache on CPU when --kv-cache-gib is 0: vLLM's default there (the memory share less what the
# worker holds, 4.7 GiB on 23.5 GiB) is zeroed at start; 1 GiB started ~6 s sooner (bench/RESULTS.md).
CPU_KV_CACHE_GIB = 1.0

# Tokenizing megabytes of text blocks the event loop; beyond this length it runs in a thread.
_THREAD_TOKENIZE_CHARS = 8192


class EngineDied(RuntimeError):
    """The vLLM engine (its process, or its thread in this one) is gone; nothing this process does
    brings it back."""


@dataclass(frozen=True)
class Prepared:
    """A prompt checked against the context window, with its token ids, and its options as vLLM's
    SamplingParams (built here, so vLLM's own checks answer 400 before any generation counts)."""

    token_ids: list[int]
    options: SamplingOptions
    params: Any
    # A prompt given as token ids: the text they decode to (what echo shows); None for text.
    prompt_text: str | None = None


@dataclass(frozen=True)
class FirstToken:
    """The top log probabilities of a prompt's first generated token (token id -> logprob)."""

    logprobs: dict[int, float]
    prompt_tokens: int
    engine_request_id: str


def _on_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


class Engine:
    def __init__(self, settings: PredictorSettings, model_dir: Path) -> None:
        self.settings = settings
        self.model_dir = model_dir
        self.llm: Any = None
        self.tokenizer: Any = None
        self.started_at: float | None = None
        self.max_model_len = settings.max_model_len
        # The sleep tier (GPU only; predictors/sleep.py): set once the engine runs, if configured.
        self.sleep: SleepControl | None = None
        self.on_gpu: bool | None = None  # known once the engine starts
        self._sleep_timer: asyncio.Task[None] | None = None
        metrics.SLEEP_STATE.labels(settings.model_name).set(0)
        metrics.WAKE_SECONDS.labels(settings.model_name)  # the series exists (empty) from the start

    @property
    def ready(self) -> bool:
        return self.llm is not None and not self.llm.errored

    async def start(self) -> None:
        # Engine construction blocks for tens of seconds; in a thread the HTTP server stays up
        # (liveness passes, readiness says not yet).
        started = time.monotonic()
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        # Before vLLM is imported: its settings and the engine process read these variables.
        caches = warm_start.use_cache_dirs()
        gpu = self.on_gpu = _on_gpu()
        in_process = self.settings.engine_in_process and not gpu
        # Read by vLLM when it builds the engine: "0" runs LLMEngine's core in this process, and
        # AsyncLLM's engine-core process with a "uni" executor in place of "mp" (CPU).
        inline = in_process or self.settings.inline_worker
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if inline else "1"
        aot_cache = warm_start.use_aot_cache(in_process and self.settings.aot_compile_cache)
        log.info(
            "engine_compile_cache", warm=caches.warm, files=caches.files_before, aot=aot_cache,
            **caches.log_fields(),
        )
        phases: dict[str, float] = {}
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs

        if in_process:
            build: Any = InprocLLM.from_engine_args
        else:
            from vllm.v1.engine.async_llm import AsyncLLM

            build = AsyncLLM.from_engine_args
        phases["import_s"] = time.monotonic() - started

        util = self.settings.gpu_memory_utilization or (0.90 if gpu else 0.25)
        kv_gib = self.settings.kv_cache_gib or (0.0 if gpu else CPU_KV_CACHE_GIB)
        args = AsyncEngineArgs(
            model=str(self.model_dir),
            served_model_name=[self.settings.model_name],
            max_model_len=self.settings.max_model_len,
            max_num_seqs=self.settings.max_num_seqs,
            gpu_memory_utilization=util,
            dtype=self.settings.dtype,
            tensor_parallel_size=self.settings.tensor_parallel_size,
            enforce_eager=self.settings.enforce_eager,
            disable_log_stats=not self.settings.log_stats,
            # vLLM's CuMem allocator, needed to move weights out and back; GPU builds only (the
            # predictor refuses the setting on CPU before it gets here: predictors/cli.py).
            enable_sleep_mode=self.settings.sleep_enabled,
            kv_cache_memory_bytes=int(kv_gib * 2**30) or None,
            # Left out at 1 (vLLM's default), so that a vLLM without the setting starts as before.
            **({"stream_interval": interval} if (interval := self.settings.stream_interval) > 1 else {}),
        )
        log.info(
            "engine_starting", model=str(self.model_dir), gpu=gpu, memory_utilization=util,
            engine_in_process=in_process, inline_worker=inline, kv_cache_gib=kv_gib,
        )
        t = time.monotonic()
        # Our own tokenizer, loaded beside the engine (not the engine's: with the engine core in
        # this process, its thread detokenizes with that one, and HF tokenizers are not for two
        # threads at once).
        def load_tokenizer() -> Any:
            t0 = time.monotonic()
            try:
                return AutoTokenizer.from_pretrained(str(self.model_dir))
            finally:
                phases["tokenizer_s"] = time.monotonic() - t0  # within engine_s, not after it

        tokenizer = asyncio.ensure_future(asyncio.to_thread(load_tokenizer))
        try:
            # Weights, compilation (or its cache), KV cache and warm-up: vLLM's own log lines split it.
            llm = await asyncio.to_thread(build, args)
        finally:
            self.tokenizer = await tokenizer
        phases["engine_s"] = time.monotonic() - t
        self.llm = llm
        self.max_model_len = self.llm.vllm_config.model_config.max_model_len
        self.started_at = time.time()
        if self.settings.sleep_enabled:
            self._start_sleep_tier()
        log.info(
            "engine_ready",
            seconds=round(time.monotonic() - started, 1),
            compile_cache_warm=caches.warm,
            compile_cache_files_written=caches.files_now() - caches.files_before,
            **{k: round(v, 2) for k, v in phases.items()},
        )

    def _start_sleep_tier(self) -> None:
        name = self.settings.model_name
        self.sleep = SleepControl(
            self.llm,
            self.settings.sleep_after_idle_s,
            self.settings.sleep_level,
            on_state=lambda asleep: metrics.SLEEP_STATE.labels(name).set(1 if asleep else 0),
            on_wake=metrics.WAKE_SECONDS.labels(name).observe,
        )
        self._sleep_timer = asyncio.get_running_loop().create_task(self.sleep.run())

    def _awake(self) -> AbstractAsyncContextManager[None]:
        """Around every engine call: wakes a sleeping engine first (no-op without the sleep tier)."""
        return self.sleep.in_use() if self.sleep is not None else nullcontext()

    def shutdown(self) -> None:
        if self._sleep_timer is not None:
            self._sleep_timer.cancel()
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    async def watch(self, every_s: float = 0.5) -> None:
        """Return never while the engine lives; raise EngineDied once it has died (its process
        killed or out of memory). A predictor without an engine can only answer errors, and vLLM
        does not restart its engine: the process must end so that its pod is restarted."""
        while True:
            await asyncio.sleep(every_s)
            if self.llm is not None and self.llm.errored:
                log.error("engine_dead", model=str(self.model_dir))
                raise EngineDied("the vLLM engine died; the predictor exits so that it is restarted")

    async def healthy(self) -> bool:
        if not self.ready:
            return False
        try:
            await self.llm.check_health()
            return True
        except Exception:
            return False

    def render_chat(self, chat: ChatPrompt) -> str:
        """The prompt text of a chat: its messages through the model's chat template."""
        tools = chat.template_tools()
        return self.render_messages(chat.plain_messages(), **(chat.chat_template_kwargs or {}),
                                    **({"tools": tools} if tools else {}))  # fmt: skip

    def render_messages(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        """Chat messages, in the form chat templates take, through the model's chat template."""
        if not self.ready:
            # Without this a chat request during engine load met a tokenizer of None and was
            # answered 400 "does not fit the chat template" instead of the 503 it is.
            raise Unavailable("the engine is not ready yet")
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **template_kwargs
            )
        except Exception as exc:  # templates raise on roles or orders they don't accept
            raise BadRequest(f"messages do not fit the model's chat template: {exc}", "messages") from None

    async def prepare(
        self, prompt: str | TokenPrompt, options: SamplingOptions, field: str = "prompt"
    ) -> Prepared:
        if not self.ready:
            raise Unavailable("the engine is not ready yet")
        vocabulary = len(self.tokenizer)
        if isinstance(prompt, TokenPrompt):
            ids = list(prompt.ids)
            outside = [t for t in ids if t >= vocabulary]
            if outside:  # vLLM's "Token id ... is out of vocabulary", as a 400 before it is queued
                words = f"{field} token ids {outside[:4]} are outside the vocabulary of {vocabulary} tokens"
                raise BadRequest(words, field)
        else:
            ids = await self.tokens(prompt)
        n = len(ids)
        if n == 0:
            raise BadRequest(f"{field} is empty after tokenization", field)
        if n >= self.max_model_len:
            raise BadRequest(
                f"{field} has {n} tokens; the model's context is {self.max_model_len} tokens", field
            )
        if n + options.max_tokens > self.max_model_len:
            raise BadRequest(
                f"max_tokens {options.max_tokens} + {n} prompt tokens exceeds the model's context "
                f"of {self.max_model_len} tokens",
                "max_tokens",
            )
        for name, token_ids in (("stop_token_ids", options.stop_token_ids),
                                ("logit_bias", [t for t, _ in options.logit_bias])):  # fmt: skip
            outside = [t for t in token_ids if t >= vocabulary]
            if outside:  # vLLM refuses them when the request is queued: a 400 before, not a 500 then
                message = f"{name} {outside[:4]} are outside the vocabulary of {vocabulary} tokens"
                raise BadRequest(message, name)
        # As vLLM's server decodes token prompts for echo (special tokens kept: they were sent).
        text = self.tokenizer.decode(ids) if isinstance(prompt, TokenPrompt) else None
        return Prepared(ids, options, self._params(options), text)

    async def tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids (no special tokens added: chat templates carry their own)."""
        if len(prompt) > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(self._encode, prompt)
        return self._encode(prompt)

    def _encode(self, prompt: str) -> list[int]:
        # Chat templates already carry the special tokens; plain prompts get none added, as vLLM does.
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    async def first_token_logprobs(self, token_ids: list[int], request_id: str, top: int) -> FirstToken:
        """The `top` most likely first tokens after a prompt, with their logprobs: one prefill and
        one greedy token, in the same batch as every generation (the judge's one call)."""
        if not self.ready:
            raise Unavailable("the engine is not ready yet")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=top, output_kind=RequestOutputKind.FINAL_ONLY
        )
        engine_id = f"{request_id or 'logprobs'}-{uuid.uuid4().hex[:12]}"
        final = None
        try:
            async with self._awake():
                prompt = TokensPrompt(prompt_token_ids=token_ids)
                async for out in self.llm.generate(prompt, params, engine_id):
                    final = out
        except Exception:
            if self.llm is None or self.llm.errored:
                raise Unavailable("the engine died; the predictor is restarting") from None
            raise
        positions = final.outputs[0].logprobs if final is not None else None
        logprobs = {token: lp.logprob for token, lp in positions[0].items()} if positions else {}
        return FirstToken(logprobs, len(token_ids), engine_id)

    def _params(self, options: SamplingOptions) -> Any:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind

        # Every option by its own name (SamplingOptions names them as vLLM does).
        fields = options.to_dict()
        fields["stop"] = fields["stop"] or None
        if not _vllm_takes_a_requests_interval():
            del fields["stream_interval"]  # `generate` groups the pieces itself
        fields["logit_bias"] = dict(options.logit_bias) or None
        if options.structured_outputs is not None:
            from vllm.sampling_params import StructuredOutputsParams

            fields["structured_outputs"] = StructuredOutputsParams(**json.loads(options.structured_outputs))
        try:
            # Deltas even for whole answers: time to first token is measured for every request.
            return SamplingParams(**fields, output_kind=RequestOutputKind.DELTA)
        except VLLMClientError as exc:
            # semserve.sampling checks what vLLM checks; this is for a check a later vLLM adds.
            _raise_if_refused(exc)
            raise

    def generate(
        self, prepared: Prepared, request_id: str, protocol: str, operation: str = "text_completion"
    ) -> AsyncIterator[Piece]:
        """The one generation path: the answer's pieces as the engine makes them (the last carries
        the finish reason), at least the stream interval's tokens each after the first; closing
        the stream aborts the request."""
        pieces = self._generated(prepared, request_id, protocol, operation)
        if _vllm_takes_a_requests_interval():
            return pieces  # vLLM's output processor groups them, clamped up to --stream-interval
        interval = stream_interval.effective(self.settings.stream_interval, prepared.options.stream_interval)
        return pieces if interval <= 1 else stream_interval.every(interval, pieces)

    async def _generated(
        self, prepared: Prepared, request_id: str, protocol: str, operation: str
    ) -> AsyncIterator[Piece]:
        if not self.ready:
            raise Unavailable("the engine is not ready")
        from vllm.inputs import TokensPrompt

        labels = (self.settings.model_name, protocol)
        # vLLM needs unique ids; a client's x-request-id may repeat or be shared by a batch.
        engine_id = f"{request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        last = started
        tokens = 0
        prompt_tokens = len(prepared.token_ids)
        metrics.IN_FLIGHT.labels(*labels).inc()
        metrics.PROMPT_TOKENS.labels(*labels).inc(prompt_tokens)
        outcome = "error"
        opts = prepared.options
        # GenAI semantic conventions: "{operation} {model}". Not made current (this is an async
        # generator, whose context is its consumer's); its phases are added when it ends.
        span = tracing.start_child(
            f"{operation} {self.settings.model_name}",
            gen_ai__operation__name=operation,
            gen_ai__system="vllm",
            gen_ai__request__model=self.settings.model_name,
            gen_ai__request__max_tokens=opts.max_tokens,
            gen_ai__request__temperature=opts.temperature,
            gen_ai__request__top_p=opts.top_p,
            gen_ai__request__top_k=opts.top_k,
            gen_ai__request__seed=opts.seed,
            gen_ai__usage__input_tokens=prompt_tokens,
            semserve__protocol=protocol,
            semserve__engine_request_id=engine_id,
        )
        timing = _Timing(tracing.now_ns() if span.is_recording() else 0)
        finish_reason: str | None = None
        first = True  # no piece yielded yet
        # A digest of the whole answer in the `generation_finished` line: it proves what this
        # engine produced for a request id (the soak checks every served answer against it)
        # without putting the answer itself in the log.
        digest = hashlib.sha256()
        try:
            async with self._awake():
                generator = self.llm.generate(
                    TokensPrompt(prompt_token_ids=prepared.token_ids),
                    prepared.params,
                    engine_id,
                )
                async for out in generator:
                    piece = out.outputs[0]
                    new_tokens = len(piece.token_ids)
                    now = time.monotonic()
                    timing.stats = out.metrics
                    if new_tokens:
                        if tokens == 0:
                            metrics.TTFT.labels(*labels).observe(now - started)
                            if timing.started_ns:
                                timing.first_token_ns = tracing.now_ns()
                            if new_tokens > 1:
                                metrics.ITL.labels(*labels).observe((now - started) / new_tokens)
                        else:
                            metrics.ITL.labels(*labels).observe((now - last) / new_tokens)
                        last = now
                    tokens += new_tokens
                    finish = piece.finish_reason if out.finished else None
                    finish_reason = finish or finish_reason
                    # A token whose text is not whole yet still brings its logprobs when asked.
                    logprobs = _logprobs_of(piece, opts.logprobs) if opts.logprobs is not None else None
                    # The prompt's come once, with the first output (vLLM pops them there).
                    of_prompt = self._prompt_logprobs(prepared.token_ids, out.prompt_logprobs, opts)
                    if piece.text or finish or logprobs or of_prompt:
                        digest.update(piece.text.encode())
                        # A token prompt's text rides with the first piece, as its logprobs do.
                        prompt_text = prepared.prompt_text if first else None
                        first = False
                        yield Piece(piece.text, finish, tokens, prompt_tokens, logprobs=logprobs,
                                    prompt_logprobs=of_prompt, prompt_text=prompt_text)  # fmt: skip
            outcome = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            # AsyncLLM.generate aborts the engine request on cancellation; we count it.
            outcome = "aborted"
            metrics.ABORTED.labels(*labels).inc()
            raise
        except BaseException as exc:
            tracing.fail(span, exc)
            if isinstance(exc, Exception) and (self.llm is None or self.llm.errored):
                # vLLM's EngineDeadError (a 500 to KServe): the documented 503 instead, and
                # `watch` ends the process.
                raise Unavailable("the engine died; the predictor is restarting") from None
            _raise_if_refused(exc)
            raise
        finally:
            metrics.IN_FLIGHT.labels(*labels).dec()
            metrics.COMPLETION_TOKENS.labels(*labels).inc(tokens)
            metrics.REQUESTS.labels(*labels, outcome).inc()
            metrics.REQUEST_LATENCY.labels(*labels).observe(time.monotonic() - started)
            # One line per generation, whatever its end (ok, aborted, error).
            log.info(
                "generation_finished",
                request_id=request_id,
                engine_request_id=engine_id,
                protocol=protocol,
                outcome=outcome,
                finish_reason=finish_reason,
                prompt_tokens=prompt_tokens,
                completion_tokens=tokens,
                output_sha256=digest.hexdigest(),
                seconds=round(time.monotonic() - started, 4),
            )
            if span.is_recording():
                _end_generation_span(span, timing, tokens, finish_reason, outcome)

    def _prompt_logprobs(
        self, token_ids: list[int], positions: Any, opts: SamplingOptions
    ) -> Logprobs | None:
        """The prompt's tokens' logprobs from a vLLM RequestOutput's `prompt_logprobs` (None at
        the first token, a dict per token after), or None when there are none in this output."""
        if opts.prompt_logprobs is None or not positions:
            return None
        out = []
        for token_id, position in zip(token_ids, positions, strict=False):
            if position is None:  # the first token: nothing predicts it
                out.append(TokenLogprob(self.tokenizer.decode([token_id]), None))
            else:
                out.append(_token_logprob(token_id, position, opts.prompt_logprobs))
        return tuple(out)

    async def answer(
        self, prepared: Prepared, request_id: str, protocol: str, operation: str = "text_completion"
    ) -> Answer:
        """A whole answer: `generate`'s pieces, consumed."""
        pieces = [p async for p in self.generate(prepared, request_id, protocol, operation)]
        if not pieces:
            raise Unavailable("the engine returned no output")
        answer = answer_of(pieces)
        # A generation that ended without a finish reason ended as if on a stop (as it always has).
        return answer if answer.finish_reason else replace(answer, finish_reason="stop")

    async def answers(
        self, prepared: list[Prepared], request_id: str, protocol: str, operation: str = "text_completion"
    ) -> list[Answer]:
        # A TaskGroup cancels (and so aborts) the siblings if one generation fails.
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self.answer(p, f"{request_id}-{i}", protocol, operation))
                         for i, p in enumerate(prepared)]
        except ExceptionGroup as group:
            # The first failure as itself: callers map BadRequest/Unavailable to 400/503, and an
            # ExceptionGroup would reach KServe as a 500 (gRPC INTERNAL).
            raise group.exceptions[0] from None
        return [t.result() for t in tasks]


@functools.cache
def _vllm_takes_a_requests_interval() -> bool:
    """Whether this vLLM's SamplingParams has `stream_interval` (it came in 2026; the engine-wide
    setting came before)."""
    from vllm import SamplingParams

    return "stream_interval" in SamplingParams.__struct_fields__


def _logprobs_of(output: Any, top: int) -> Logprobs:
    """The new tokens' logprobs of a vLLM CompletionOutput (a delta): each token's own, and the
    `top` most likely at its place, most likely first."""
    positions = zip(output.token_ids, output.logprobs or (), strict=False)
    return tuple(_token_logprob(token_id, position, top) for token_id, position in positions)


def _token_logprob(token_id: int, position: dict[int, Any], top: int) -> TokenLogprob:
    """One token's logprob from vLLM's {token id: Logprob} at its place, with the `top` most
    likely there, most likely first."""
    chosen = position[token_id]
    ranked = sorted((lp for lp in position.values() if lp.rank is not None and lp.rank <= top),
                    key=lambda lp: lp.rank)  # fmt: skip
    alternatives = tuple((lp.decoded_token or "", lp.logprob) for lp in ranked)
    return TokenLogprob(chosen.decoded_token or "", chosen.logprob, alternatives)


def _raise_if_refused(exc: BaseException) -> None:
    """vLLM's refusal of a request (a check of its own that `prepare` does not make) as the 400 it
    is, naming vLLM's parameter; anything else is left to its caller."""
    from vllm.exceptions import VLLMClientError

    if isinstance(exc, VLLMClientError):
        field = getattr(exc, "parameter", None) or "sampling_parameters"
        raise BadRequest(str(exc.args[0]) if exc.args else str(exc), field) from None


@dataclass
class _Timing:
    """What the generation span's phases are made of."""

    started_ns: int  # 0: not traced
    first_token_ns: int = 0  # when the first token reached this process
    stats: Any = None  # vLLM's RequestStateStats (engine-core monotonic timestamps), if log_stats


def _end_generation_span(
    span: Any, timing: _Timing, tokens: int, finish_reason: str | None, outcome: str
) -> None:
    """Close the generation span with its usage and three sequential children that add up to it:
    queue (arrival to first scheduled), prefill (to the first token) and decode (to the end).

    The phase boundaries come from vLLM's engine-core timestamps (time.monotonic() in the engine
    process; CLOCK_MONOTONIC is one clock for every process of a Linux host), converted to wall
    time once, here. Without them (--no-log-stats) only the time to the first token as seen by
    this process is known: queue and prefill are then one span, marked approximate.
    """
    end_ns = tracing.now_ns()
    start_ns = timing.started_ns
    mono_now = time.monotonic()

    def wall(ts: float) -> int:
        # Clamped into the parent: a few µs of clock-read skew must not make a child outlive it.
        raw = tracing.monotonic_to_ns(ts, mono_now=mono_now, wall_now_ns=end_ns)
        return min(max(raw, start_ns), end_ns)

    stats = timing.stats
    first_ns = timing.first_token_ns
    phases: list[tuple[str, int, int]] = []
    if stats is not None and getattr(stats, "scheduled_ts", 0.0) > 0.0:
        scheduled_ns = wall(stats.scheduled_ts)
        if getattr(stats, "first_token_ts", 0.0) > 0.0:
            first_ns = max(wall(stats.first_token_ts), scheduled_ns)
        phases.append(("vllm.queue", start_ns, scheduled_ns))
        if first_ns:
            phases.append(("vllm.prefill", scheduled_ns, first_ns))
        span.set_attribute("semserve.timing_source", "engine")
        span.set_attribute("semserve.preemptions", int(getattr(stats, "num_preemptions", 0)))
    elif first_ns:
        phases.append(("vllm.queue_and_prefill", start_ns, first_ns))
        span.set_attribute("semserve.timing_source", "frontend-approximate")
    if first_ns:
        phases.append(("vllm.decode", first_ns, end_ns))
        span.add_event("gen_ai.first_token", timestamp=first_ns)
        span.set_attribute("gen_ai.server.time_to_first_token", (first_ns - start_ns) / 1e9)
        if len(phases) > 1 and phases[0][0] == "vllm.queue":
            span.set_attribute("semserve.queue_time_s", (phases[0][2] - phases[0][1]) / 1e9)
    parent = tracing.context_of(span)
    for name, a, b in phases:
        tracing.start_child(name, parent=parent, start_ns=a).end(end_time=b)
    span.set_attribute("gen_ai.usage.output_tokens", tokens)
    span.set_attribute("semserve.outcome", outcome)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.end(end_time=end_ns)
