"""End-to-end cells of `semserve bench cache`: each path x protocol x concurrency through the
transformer (and direct to the predictor), closed loop, with the transformer's own means."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.cache_clients import Clients, Target
from bench.predictor import _percentile

PROTOCOLS = ("rest", "grpc")

# Fresh prompts for misses: varied wording, and a number that differs every time, so each one is
# new to the exact layer and rejected by the verifier (changed number) when the KNN finds its kin.
_ASKS = (
    "Write one sentence about", "Give a fun fact about", "Name a color that suits",
    "Describe in a few words", "Suggest a name for", "Tell a tiny story about",
    "List two uses of", "What rhymes with",
)
_TOPICS = (
    "a lighthouse", "autumn leaves", "a red bicycle", "the moon", "a quiet library", "mountain goats",
    "a paper boat", "thunderstorms", "a jazz trumpet", "fresh bread", "a glacier", "city pigeons",
    "a wooden spoon", "desert cacti", "an old clock", "coral reefs", "a snow owl", "rainy Mondays",
    "a copper kettle", "wild strawberries", "a steam train", "sunflowers", "a chess knight", "fog",
)

@dataclass
class Cell:
    path: str  # floor | exact | semantic | miss | direct
    protocol: str
    concurrency: int
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the cell's runs (for req/s)
    statuses: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    server_ms: float | None = None  # transformer's own mean request time in this cell
    lookup_ms: float | None = None  # transformer's mean cache lookup time in this cell

    @property
    def expected(self) -> str:
        return self.path

    @property
    def unexpected(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != self.expected)

    @property
    def per_s(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else float("nan")

    @property
    def p50(self) -> float:
        return _percentile(self.latencies_ms, 0.5)

    @property
    def p99(self) -> float:
        return _percentile(self.latencies_ms, 0.99)


async def _run_into(cell: Cell, clients: Clients, target: Target, prompts: Sequence[str]) -> None:
    """Closed loop: `cell.concurrency` workers take the prompts in order; only answers with the
    expected status count for latency (others are counted in `statuses`)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)

    async def worker() -> None:
        while True:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t = time.perf_counter()
            try:
                if cell.path == "floor":
                    status = await clients.floor(target, cell.protocol)
                else:
                    status = await clients.call(target, cell.protocol, prompt)
            except Exception as e:
                cell.errors += 1
                if cell.errors <= 3:
                    print(f"    error ({cell.path}/{cell.protocol}): {e!r}"[:300], flush=True)
                continue
            ms = (time.perf_counter() - t) * 1000.0
            cell.statuses[status] += 1
            if status == cell.expected:
                cell.latencies_ms.append(ms)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
    cell.seconds += time.perf_counter() - started


class ServerStats:
    """Means from the transformer's /metrics (sum and count deltas around one cell)."""

    def __init__(self, http: httpx.AsyncClient, base: str) -> None:
        self.http, self.base = http, base

    async def snapshot(self) -> dict[str, float]:
        text = (await self.http.get(f"{self.base}/metrics")).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(("semserve_transformer_request_duration_seconds_",
                                "semserve_cache_lookup_seconds_")) and ("_sum" in line or "_count" in line):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out

    @staticmethod
    def mean_ms(before: dict[str, float], after: dict[str, float], prefix: str, *labels: str) -> float | None:
        s = c = 0.0
        for key, v in after.items():
            if not key.startswith(prefix) or not all(lab in key for lab in labels):
                continue
            delta = v - before.get(key, 0.0)
            if "_sum" in key:
                s += delta
            elif "_count" in key:
                c += delta
        return 1000.0 * s / c if c else None

    async def around(self, cell: Cell, run: Any) -> None:
        before = await self.snapshot()
        await run
        after = await self.snapshot()
        proto = "v2-grpc" if cell.protocol == "grpc" else "v2-rest"
        cell.server_ms = self.mean_ms(before, after, "semserve_transformer_request_duration_seconds_",
                                      f'protocol="{proto}"', f'cache="{cell.path}"')
        cell.lookup_ms = self.mean_ms(before, after, "semserve_cache_lookup_seconds_")


def miss_prompts(n: int, rng: random.Random) -> list[str]:
    return [f"{rng.choice(_ASKS)} {rng.choice(_TOPICS)}, case {rng.randrange(10**6)}." for _ in range(n)]


def _cycle(items: Sequence[str], n: int, rng: random.Random) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        chunk = list(items)
        rng.shuffle(chunk)
        out.extend(chunk)
    return out[:n]


async def end_to_end(
    transformer: Target, predictor: Target, exact_prompts: Sequence[str], semantic_prompts: Sequence[str],
    levels: Sequence[int], hit_requests: int, miss_requests: int, max_tokens: int, warmup: int,
    rng: random.Random,
) -> list[Cell]:
    clients = Clients(max_tokens)
    stats = ServerStats(clients.http, transformer.http)
    cells: list[Cell] = []
    try:
        # Seed: every prompt whose repeat or paraphrase we will send. no-cache: skip the lookup, so
        # two stored prompts that paraphrase each other are both stored (and exact later).
        print(f"  seeding {len(exact_prompts)} prompts (misses, stored)", flush=True)
        seed = Cell("seed", "rest", 16)
        sem = asyncio.Semaphore(16)

        async def seed_one(p: str) -> None:
            async with sem:
                seed.statuses[await clients.call(transformer, "rest", p, {"cache-control": "no-cache"})] += 1

        await asyncio.gather(*(seed_one(p) for p in exact_prompts))
        print(f"    seed statuses: {dict(seed.statuses)}", flush=True)
        await asyncio.sleep(0.5)
        for protocol in PROTOCOLS:  # warm-up: connections, lazy paths, the embedder's first runs
            for path, prompts in (("exact", exact_prompts), ("semantic", semantic_prompts)):
                await _run_into(Cell(path, protocol, 4), clients, transformer, _cycle(prompts, warmup, rng))
            await _run_into(Cell("miss", protocol, 1), clients, transformer, miss_prompts(2, rng))
            await _run_into(Cell("direct", protocol, 1), clients, predictor, miss_prompts(2, rng))
        for protocol in PROTOCOLS:
            for c in levels:
                floor = Cell("floor", protocol, c)
                await _run_into(floor, clients, transformer, ["-"] * hit_requests)
                cells.append(floor)
                _progress(floor)
                for path, prompts in (("exact", exact_prompts), ("semantic", semantic_prompts)):
                    cell = Cell(path, protocol, c)
                    await stats.around(cell, _run_into(cell, clients, transformer,
                                                       _cycle(prompts, hit_requests, rng)))
                    cells.append(cell)
                    _progress(cell)
                miss, direct = Cell("miss", protocol, c), Cell("direct", protocol, c)
                chunk = max(1, c)
                done = 0
                before = await stats.snapshot()
                while done < miss_requests:
                    k = min(chunk, miss_requests - done)
                    # Alternate which goes first, so neither always follows the other's batch.
                    pair = [(miss, transformer), (direct, predictor)]
                    if (done // chunk) % 2:
                        pair.reverse()
                    for cell, target in pair:
                        await _run_into(cell, clients, target, miss_prompts(k, rng))
                    done += k
                after = await stats.snapshot()
                proto = "v2-grpc" if protocol == "grpc" else "v2-rest"
                miss.server_ms = stats.mean_ms(
                    before, after, "semserve_transformer_request_duration_seconds_",
                    f'protocol="{proto}"', 'cache="miss"',
                )
                miss.lookup_ms = stats.mean_ms(before, after, "semserve_cache_lookup_seconds_")
                for cell in (miss, direct):
                    cells.append(cell)
                    _progress(cell)
    finally:
        await clients.close()
    return cells


def _progress(cell: Cell) -> None:
    extra = f", unexpected {dict(cell.statuses)}" if cell.unexpected else ""
    print(f"  {cell.path:<8} {cell.protocol:<4} c={cell.concurrency:<3} n={len(cell.latencies_ms):<4} "
          f"{cell.per_s:6.0f}/s p50 {cell.p50:7.2f} ms  p99 {cell.p99:7.2f} ms  errors {cell.errors}{extra}",
          flush=True)
