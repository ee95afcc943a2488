"""`semserve bench cache --v2-route-ab N`: v2 REST exact hits through two transformers on the same
Redis index, one with semserve's own v2 REST infer route (semserve/v2/rest_infer.py, the default)
and one with `--no-v2-fast-path` (KServe's route), side by side in one run: the same prompts, the
same client, the two alternated request by request so that noise from other work hits both alike."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.cache_clients import Clients, Target


@dataclass
class RouteCell:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    other: int = 0  # answers that were not exact hits (not counted in the latencies)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def route_ab(on: Target, off: Target, prompts: Sequence[str], rounds: int,
                   warmup: int = 20) -> tuple[RouteCell, RouteCell]:  # fmt: skip
    """`rounds` exact hits per side; the side that goes first alternates too."""
    clients = Clients(max_tokens=8)
    cells = {on.name: RouteCell(on.name), off.name: RouteCell(off.name)}
    try:
        for i in range(warmup):
            for target in (on, off):
                await clients.call(target, "rest", prompts[i % len(prompts)])
        for i in range(rounds):
            prompt = prompts[i % len(prompts)]
            for target in ((on, off) if i % 2 == 0 else (off, on)):
                started = time.perf_counter()
                status = await clients.call(target, "rest", prompt)
                ms = (time.perf_counter() - started) * 1000.0
                cell = cells[target.name]
                if status == "exact":
                    cell.latencies_ms.append(ms)
                else:
                    cell.other += 1
    finally:
        await clients.close()
    return cells[on.name], cells[off.name]


def route_ab_table(on: RouteCell, off: RouteCell) -> str:
    rows = ["| v2 REST exact hit | n | p50 ms | p90 ms | p99 ms | not exact |", "|---|---|---|---|---|---|"]
    for cell in (on, off):
        lat = cell.latencies_ms
        rows.append(f"| {cell.name} | {len(lat)} | {_percentile(lat, 0.5):.2f} | {_percentile(lat, 0.9):.2f} "
                    f"| {_percentile(lat, 0.99):.2f} | {cell.other} |")  # fmt: skip
    gain = _percentile(off.latencies_ms, 0.5) - _percentile(on.latencies_ms, 0.5)
    rows.append(f"\np50 gain of the owned route: {gain:.2f} ms")
    return "\n".join(rows)
