"""The sleep tier between warm and zero: an idle timer and a two-state machine (awake, asleep) over
an engine that has vLLM's sleep mode (`sleep(level)`, `wake_up()`; GPU builds only).

- After `idle_s` with no generation running, `tick` puts the engine to sleep (level 1: weights to
  host memory, KV cache freed; the process, the allocator and the compiled graphs stay).
- Every generation runs inside `in_use()`: it wakes a sleeping engine first, and no sleep starts
  while one runs.
- `sleep()` and `wake()` are also what the admin routes call (predictors/admin_routes.py).

One lock orders the transitions: a request that arrives while the engine is going to sleep waits for
that, then wakes it; one that arrives during a wake waits for the wake. Nothing here imports vLLM, so
the machine is tested with a stand-in engine (vLLM's sleep cannot run on CPU).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from semserve import sleep_mode
from semserve.logs import get_logger

log = get_logger("semserve.predictor.sleep")


class SleepingEngine(Protocol):
    """What vLLM's AsyncLLM offers for sleep mode (vllm/v1/engine/async_llm.py)."""

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> bool: ...


class Busy(Exception):
    """Generations are running: the engine is not put to sleep under them."""


@dataclass(frozen=True)
class SleepState:
    """What GET /admin/sleep answers."""

    state: str  # "awake" | "asleep"
    level: int
    sleep_after_idle_s: float
    idle_s: float  # since the last generation ended (0 while one runs)
    in_flight: int
    sleeps: int
    wakes: int
    last_wake_s: float | None  # how long the last wake took

    def to_dict(self) -> dict[str, Any]:
        return {"sleep_mode": True, **asdict(self)}


class SleepControl:
    def __init__(
        self,
        engine: SleepingEngine,
        idle_s: float,
        level: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_state: Callable[[bool], None] = lambda asleep: None,
        on_wake: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        if idle_s <= 0:
            raise ValueError("idle_s must be > 0")
        self.engine = engine
        self.idle_s = idle_s
        self.level = level
        self.clock = clock
        self._on_state = on_state
        self._on_wake = on_wake
        self._lock = asyncio.Lock()
        self.asleep = False
        self.in_flight = 0
        self.last_active = clock()
        self.sleeps = 0
        self.wakes = 0
        self.last_wake_s: float | None = None
        on_state(False)

    def state(self) -> SleepState:
        idle = 0.0 if self.in_flight else max(0.0, self.clock() - self.last_active)
        return SleepState(
            "asleep" if self.asleep else "awake", self.level, self.idle_s, round(idle, 3),
            self.in_flight, self.sleeps, self.wakes, self.last_wake_s,
        )  # fmt: skip

    @asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Around one generation: awake for it, and no sleep while it runs."""
        self.in_flight += 1
        try:
            # A sleep or wake under way holds the lock: wait for it, then wake if it slept.
            if self.asleep or self._lock.locked():
                async with self._lock:
                    if self.asleep:
                        await self._wake("request")
            yield
        finally:
            self.in_flight -= 1
            self.last_active = self.clock()

    def due(self) -> bool:
        return (
            not self.asleep
            and self.in_flight == 0
            and self.clock() - self.last_active >= self.idle_s
        )

    async def tick(self) -> bool:
        """Sleep if the idle window has passed; True if it slept now."""
        if not self.due():
            return False
        try:
            return await self.sleep("idle")
        except Busy:  # a request came in between: it keeps the engine awake
            return False

    async def run(self) -> None:
        """The idle timer; runs until cancelled."""
        every = min(5.0, max(0.05, self.idle_s / 4))
        while True:
            await asyncio.sleep(every)
            try:
                await self.tick()
            except Exception as exc:  # a failed sleep leaves the engine awake and serving
                log.error("engine_sleep_failed", error=str(exc))

    async def sleep(self, reason: str) -> bool:
        """Put the engine to sleep; False if it already sleeps. Raises Busy while generations run."""
        async with self._lock:
            if self.asleep:
                return False
            if self.in_flight:
                raise Busy(f"{self.in_flight} generation(s) running; the engine sleeps once they end")
            started = self.clock()
            await self.engine.sleep(self.level)
            self.asleep = True
            self.sleeps += 1
            self._on_state(True)
            log.info(
                "engine_asleep", reason=reason, sleep_level=self.level,
                seconds=round(self.clock() - started, 3), idle_s=round(started - self.last_active, 1),
            )  # fmt: skip
            return True

    async def wake(self, reason: str) -> bool:
        """Wake the engine; False if it was awake."""
        async with self._lock:
            if not self.asleep:
                return False
            await self._wake(reason)
            return True

    async def _wake(self, reason: str) -> None:
        started = self.clock()
        await self.engine.wake_up()
        seconds = self.clock() - started
        self.asleep = False
        self.wakes += 1
        self.last_wake_s = round(seconds, 3)
        self.last_active = self.clock()
        self._on_state(False)
        self._on_wake(seconds)
        log.info("engine_awake", reason=reason, seconds=round(seconds, 3))


def platform_refusal(sleep_after_idle_s: float) -> str | None:
    """Why this machine's vLLM cannot sleep (None: it can, or the setting is off). Asks vLLM's own
    platform (what `enable_sleep_mode` checks) without building an engine: seconds, not a minute."""
    if sleep_after_idle_s <= 0:
        return None
    from vllm.platforms import current_platform

    return sleep_mode.refusal(
        sleep_after_idle_s,
        str(current_platform.device_type or "unknown"),
        current_platform.is_sleep_mode_available(),
    )
