"""Calls to the predictor, all over its gRPC port (the one port Knative routes): `ModelInfer` for
whole answers, `ModelStreamInfer` with the `stream` input for token streams. Raw prompts travel in
`text_input`, chat prompts in `chat` (the predictor applies the chat template), sampling in the
`sampling_parameters` JSON input.

Every failure becomes a ServingError: the predictor's own 4xx pass through with its message and
field; unreachable, slow or failing becomes 503.

With --predictor-hold-s on, a miss to a predictor not known ready (no answer within
--speculate-warm-window-s, or its channel not connected) first waits until gRPC ServerReady says it
is ready (transformers_svc/held_misses.py: the per-tenant cap, the shared wait, the measured start
time); the judge's calls never wait (they are part of a lookup, and hits must not wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from kserve.errors import InvalidInput
from kserve.protocol.grpc import grpc_predict_v2_pb2 as kserve_pb

from semserve import tracing, v2
from semserve.answer import Piece
from semserve.errors import BadRequest, NotFound, ServingError, Unavailable
from semserve.judge_protocol import CACHED_INPUT, PROBABILITY_OUTPUT, QUERY_INPUT, judge_model_name
from semserve.logs import get_logger
from semserve.openai_protocol import ChatPrompt, TokenPrompt
from semserve.sampling import SamplingOptions
from semserve.v2 import grpc_service as service
from semserve.v2 import grpc_tensors as tensors
from semserve.v2 import inference_pb2 as pb
from transformers_svc import metrics
from transformers_svc.auth import tenant_var
from transformers_svc.config import TransformerSettings
from transformers_svc.held_misses import HeldMisses

log = get_logger("semserve.transformer.upstream")
_T = TypeVar("_T")

# What the predictor generates from: a raw prompt, or a chat it renders with its template.
Prompt = str | ChatPrompt | TokenPrompt


def _sampling_json(options: SamplingOptions, stream_interval: int) -> str:
    # KServe's v2 proto carries only bool/int/string parameters; the JSON input carries floats.
    d = options.to_dict()
    # This transformer's interval, not the request's: a generation may be shared by requests that
    # ask for different ones, and each groups the pieces to its own (semserve/stream_interval.py).
    d["stream_interval"] = stream_interval if stream_interval > 1 else None
    return json.dumps({k: v for k, v in d.items() if v is not None})


def _bytes_input(name: str, data: bytes) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(
        name=name, datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[data])
    )


class PredictorClient:
    def __init__(self, settings: TransformerSettings) -> None:
        self.settings = settings
        self.model = settings.model_name
        self._channel: grpc.aio.Channel | None = None
        # When the predictor last answered (time.monotonic()), None before its first answer: a
        # predictor that answered recently is up, so speculating on it wakes nothing.
        self.last_answered: float | None = None
        # Holding (--predictor-hold-s): when ServerReady last said ready, and when a call last
        # found the predictor unavailable (it is not known ready after that until it answers).
        self._ready_at: float | None = None
        self._failed_at: float | None = None
        self.held: HeldMisses | None = None
        if settings.predictor_hold_s > 0:
            self.held = HeldMisses(
                self.model, settings.held_misses_per_tenant, settings.predictor_start_s, self._server_ready
            )

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                self.settings.predictor_host,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.max_send_message_length", 64 * 1024 * 1024),
                    # Reconnect quickly after a predictor restart instead of backing off for ~minutes.
                    ("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.min_reconnect_backoff_ms", 500),
                    ("grpc.max_reconnect_backoff_ms", 2000),
                ],
            )
        return self._channel

    def _call(self, method: str, *, stream: bool) -> Any:
        channel = self._open()
        if stream:
            return channel.stream_stream(
                method,
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )
        return channel.unary_unary(
            method,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )

    async def close(self) -> None:
        if self.held is not None:
            await self.held.close()
        if self._channel is not None:
            await self._channel.close()

    # -- holding misses while the predictor is not ready --------------------------------------------

    async def _server_ready(self, within_s: float) -> bool:
        """gRPC ServerReady, waiting for the channel to connect (a predictor process not started
        yet) at most `within_s`; False for any failure."""
        call = self._open().unary_unary(
            f"/{service.SERVICE}/ServerReady",
            request_serializer=kserve_pb.ServerReadyRequest.SerializeToString,
            response_deserializer=kserve_pb.ServerReadyResponse.FromString,
        )
        try:
            response = await call(kserve_pb.ServerReadyRequest(), timeout=within_s, wait_for_ready=True)
        except grpc.aio.AioRpcError:
            return False
        return bool(response.ready)

    def _known_ready(self) -> bool:
        seen = max(self.last_answered or 0.0, self._ready_at or 0.0)
        if not seen or (self._failed_at is not None and self._failed_at >= seen):
            return False
        if time.monotonic() - seen > self.settings.speculate_warm_window_s:
            return False
        return self._open().get_state() == grpc.ChannelConnectivity.READY

    async def _until_ready(self) -> None:
        """With holding on, a miss to a predictor not known ready waits until it is (or is refused:
        the tenant's cap of held misses, or --predictor-hold-s without it becoming ready)."""
        if self.held is None or self._known_ready():
            return
        tenant = tenant_var.get() or self.settings.tenant
        await self.held.wait_ready(tenant, self.settings.predictor_hold_s)
        self._ready_at = time.monotonic()

    def _answered(self) -> None:
        self.last_answered = time.monotonic()

    def _unavailable(self, exc: ServingError) -> None:
        if isinstance(exc, Unavailable):
            self._failed_at = time.monotonic()

    def _request(
        self, prompt: Prompt, options: SamplingOptions, request_id: str, *, stream: bool
    ) -> pb.ModelInferRequest:
        if isinstance(prompt, ChatPrompt):
            first = _bytes_input(v2.CHAT_INPUT, prompt.model_dump_json(exclude_none=True).encode())
        elif isinstance(prompt, TokenPrompt):
            first = pb.ModelInferRequest.InferInputTensor(
                name=v2.IDS_INPUT, datatype="INT64", shape=[1, len(prompt.ids)],
                contents=pb.InferTensorContents(int64_contents=list(prompt.ids)),
            )
        else:
            first = _bytes_input(v2.TEXT_INPUT, prompt.encode())
        sampling = _sampling_json(options, self.settings.stream_interval).encode()
        request = pb.ModelInferRequest(
            model_name=self.model, id=request_id, inputs=[first, _bytes_input(v2.SAMPLING_INPUT, sampling)]
        )
        if stream:
            request.inputs.add(
                name=v2.STREAM_INPUT, datatype="BOOL", shape=[1],
                contents=pb.InferTensorContents(bool_contents=[True]),
            )
        return request

    def _span(self, method: str, prompt_kind: str, model: str | None = None) -> Any:
        host, _, port = self.settings.predictor_host.rpartition(":")
        return tracing.start_child(
            f"inference.GRPCInferenceService/{method}", tracing.SpanKind.CLIENT,
            rpc__system="grpc", rpc__service=service.SERVICE, rpc__method=method,
            server__address=host or None, server__port=int(port) if port.isdigit() else None,
            gen_ai__request__model=model or self.model,
            semserve__prompt_kind=prompt_kind,
        )

    @staticmethod
    def _metadata(request_id: str, span: Any) -> Any:
        # traceparent rides in the metadata: the predictor's span continues this trace.
        rid = _wire_id(request_id)
        pairs = tracing.grpc_metadata((("x-request-id", rid),) if rid else (), tracing.context_of(span))
        return pairs or None

    async def generate(self, prompt: Prompt, options: SamplingOptions, request_id: str) -> Piece:
        """The predictor's whole answer (ModelInfer)."""
        span = self._span("ModelInfer", _prompt_kind(prompt))

        def request() -> pb.ModelInferRequest:
            return self._request(prompt, options, request_id, stream=False)

        return await self._unary(request, request_id, span, self.model, _piece, hold=True)

    async def judge(self, query: str, cached: str, request_id: str) -> float:
        """The predictor's P(one answer fits both prompts), from its `{model}-judge` model
        (ModelInfer). Fails as generate() does: a ServingError, never a guess."""
        model = judge_model_name(self.model)
        span = self._span("ModelInfer", "judge", model)

        def request() -> pb.ModelInferRequest:
            inputs = [_bytes_input(QUERY_INPUT, query.encode()), _bytes_input(CACHED_INPUT, cached.encode())]
            return pb.ModelInferRequest(model_name=model, id=request_id, inputs=inputs)

        return await self._unary(request, request_id, span, model, _probability)

    async def _unary(
        self,
        build: Callable[[], pb.ModelInferRequest],
        request_id: str,
        span: Any,
        model: str,
        parse: Callable[[pb.ModelInferResponse], _T],
        hold: bool = False,
    ) -> _T:
        """One ModelInfer, with the span, gRPC status and call metrics every unary call records;
        `hold`: after waiting for a predictor not known ready (with holding on)."""
        try:
            try:
                if hold:
                    await self._until_ready()
                response = await self._call(service.MODEL_INFER, stream=False)(
                    build(),
                    timeout=self.settings.predictor_timeout_s,
                    metadata=self._metadata(request_id, span),
                )
            except grpc.aio.AioRpcError as err:
                span.set_attribute("rpc.grpc.status_code", err.code().value[0])
                raise _from_grpc(err) from None
            span.set_attribute("rpc.grpc.status_code", 0)
            result = parse(response)
        except ServingError as exc:
            metrics.PREDICTOR_CALLS.labels(model, "grpc", metrics.outcome_of(exc)).inc()
            tracing.fail(span, exc)
            self._unavailable(exc)
            raise
        finally:
            span.end()
        metrics.PREDICTOR_CALLS.labels(model, "grpc", "ok").inc()
        self._answered()
        return result

    async def stream(self, prompt: Prompt, options: SamplingOptions, request_id: str) -> AsyncIterator[Piece]:
        """The predictor's answer as it is generated (ModelStreamInfer). Closing this generator
        cancels the call, and the predictor aborts the generation."""
        # An async generator runs in its consumer's context: the span is started, not made current,
        # and ended here whether the stream completes, fails or is closed early.
        span = self._span("ModelStreamInfer", _prompt_kind(prompt))
        call: Any = None
        pieces = 0
        finished = False
        try:
            try:
                await self._until_ready()
                # Made after the wait: the call's deadline starts when it is made.
                call = self._call(service.MODEL_STREAM_INFER, stream=True)(
                    timeout=self.settings.predictor_timeout_s, metadata=self._metadata(request_id, span)
                )
                await call.write(self._request(prompt, options, request_id, stream=True))
                await call.done_writing()
                async for message in call:
                    if message.error_message:
                        raise _from_stream_error(message)
                    if finished:
                        continue  # nothing may follow the final response; read the call to its end
                    piece = _piece(message.infer_response)
                    finished = bool(tensors.plain_parameters(message.infer_response.parameters).get(
                        v2.FINAL_RESPONSE
                    ))
                    if piece.text or piece.finish_reason or piece.logprobs or _reports_prompt(piece):
                        pieces += 1
                        self._answered()
                        yield piece
                if not finished:
                    raise Unavailable("the predictor's stream ended before its final response")
            except grpc.aio.AioRpcError as err:
                span.set_attribute("rpc.grpc.status_code", err.code().value[0])
                raise _from_grpc(err) from None
            metrics.PREDICTOR_CALLS.labels(self.model, "grpc-stream", "ok").inc()
        except ServingError as exc:
            metrics.PREDICTOR_CALLS.labels(self.model, "grpc-stream", metrics.outcome_of(exc)).inc()
            tracing.fail(span, exc)
            self._unavailable(exc)
            raise
        finally:
            if call is None:
                pass  # refused or cancelled while held: no call was made
            elif finished:
                # The answer is whole; the server ends the call by itself. Cancelling now could
                # still reach its generation in its last step and count as an abort.
                _let_finish(call)
            else:
                call.cancel()  # the predictor aborts the generation
            span.set_attribute("semserve.stream.pieces", pieces)
            span.end()


_FINISHING: set[asyncio.Task[None]] = set()


def _let_finish(call: Any) -> None:
    async def drain() -> None:
        with contextlib.suppress(Exception):
            async for _ in call:
                pass

    task = asyncio.ensure_future(drain())
    _FINISHING.add(task)  # held until done: a task nobody references may be collected early
    task.add_done_callback(_FINISHING.discard)


def _prompt_kind(prompt: Prompt) -> str:
    if isinstance(prompt, TokenPrompt):
        return "tokens"
    return "chat" if isinstance(prompt, ChatPrompt) else "text"


def _reports_prompt(piece: Piece) -> bool:
    return piece.prompt_logprobs is not None or piece.prompt_text is not None


def _probability(response: pb.ModelInferResponse) -> float:
    """The judge's one FP32 value; anything else is a predictor fault (503), not a verdict."""
    try:
        values = tensors.output_columns(response).get(PROBABILITY_OUTPUT) or []
    except (InvalidInput, ValueError) as exc:
        raise Unavailable(f"predictor's judge answer is unreadable: {exc}") from None
    if len(values) != 1 or not 0.0 <= float(values[0]) <= 1.0:
        raise Unavailable(f"predictor's judge answer lacks one {PROBABILITY_OUTPUT} in [0, 1]")
    return float(values[0])


def _piece(response: pb.ModelInferResponse) -> Piece:
    columns = tensors.output_columns(response)
    [result] = v2.results_from_columns(columns.get)
    params = tensors.plain_parameters(response.parameters)
    revision = params.get(v2.MODEL_REVISION)
    return Piece(
        text=result.text,
        finish_reason=result.finish_reason or None,
        completion_tokens=result.completion_tokens,
        prompt_tokens=int(params.get(v2.PROMPT_TOKENS) or 0),
        model_revision=str(revision) if revision else None,
        logprobs=result.logprobs,
        prompt_logprobs=result.prompt_logprobs,
        prompt_text=result.prompt_text,
    )


def _wire_id(request_id: str) -> str:
    """The request id as a header/metadata value may carry it: a v2 body's `id` can hold any text,
    and a control character there would fail the whole upstream call."""
    return "".join(c for c in request_id if " " <= c <= "~")[:256]


def _from_stream_error(message: pb.ModelStreamInferResponse) -> ServingError:
    params = tensors.plain_parameters(message.infer_response.parameters)
    status = params.get(service.ERROR_STATUS)
    field = params.get(service.ERROR_FIELD) or None
    text = message.error_message
    if status == 400:
        return BadRequest(text, field)
    if status == 404:
        return NotFound(text, field)
    log.warning("predictor_stream_error", status=status, details=text[:200])
    return Unavailable(f"predictor failed: {text[:200]}")


def _from_grpc(err: grpc.aio.AioRpcError) -> ServingError:
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadRequest(details, _field_of(err))
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(details)
    log.warning("predictor_grpc_error", code=code.name, details=details[:200])
    return Unavailable(f"predictor unavailable ({code.name}): {details[:200]}")


def _field_of(err: grpc.aio.AioRpcError) -> str | None:
    for key, value in err.trailing_metadata() or ():
        if key == service.ERROR_FIELD_METADATA and isinstance(value, str):
            return value or None
    return None
