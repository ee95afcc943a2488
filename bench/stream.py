"""`semserve bench stream`: streaming TTFT and inter-token latency of a cache miss through the
transformer (its gRPC ModelStreamInfer hop to the predictor) against the same request sent straight
to the predictor's OpenAI route, and to vLLM's own OpenAI server on the same model and limits.

One run starts Redis (RediSearch), the predictor and a transformer that reaches the predictor only
over gRPC (child processes, as `semserve bench cache` does). At each concurrency level it sends
streaming chat completions (temperature 0, `max_tokens` output tokens with `ignore_eos`, a prompt
that is new every time, so every transformer request is a real miss: lookup, gRPC stream, store) to

  transformer  the transformer's /openai/v1/chat/completions
  direct       the predictor's own /openai/v1/chat/completions (same engine, no transformer)

in alternating waves (they share one predictor, so machine noise hits both alike). Then both stop,
and vLLM's own server (`python -m vllm.entrypoints.openai.api_server`, as `semserve bench predictor`
runs it) gets the direct cell's prompts at the same levels. Per request the client records TTFT (the
first chunk with content) and the mean inter-token latency: (last content chunk - first) / (tokens
- 1), tokens from `usage`, so a server that packs several tokens in one chunk is not favoured.

    flock /tmp/semserve-heavy.lock .venv/bin/semserve bench stream --output bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cache_e2e import ServerStats, miss_prompts
from bench.predictor import Server, _free_port, _machine, _percentile
from bench.procs import LOG_DIR, CoreSplit, Proc

MODEL = "llm"
ENGINE_LIMITS = ["--max-model-len", "2048"]
GOAL_TTFT_RATIO = 1.10
GOAL_TTFT_ADDED_MS = 10.0
GOAL_ITL_RATIO = 1.05
TARGETS = ("transformer", "direct", "vllm")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Sample:
    """One streamed answer as the client saw it."""

    ttft_ms: float
    itl_ms: float  # mean gap per token after the first; nan with fewer than 2 tokens
    tokens: int
    chunks: int  # content chunks (tokens / chunks > 1: the server packs tokens)


@dataclass
class Cell:
    target: str  # transformer | direct | vllm
    concurrency: int
    samples: list[Sample] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)  # x-semserve-cache ("direct": none)
    errors: int = 0
    lookup_ms: float | None = None  # transformer cells: its mean cache lookup (from /metrics)
    # Transformer cells: the transformer process's CPU time while its waves ran (nothing else
    # reached it then), for what one of its cores can relay.
    cpu_ms: float | None = None

    @property
    def summary(self) -> Summary:
        return summarize(self.samples)

    @property
    def cpu_ms_per_token(self) -> float:
        tokens = sum(s.tokens for s in self.samples)
        return self.cpu_ms / tokens if self.cpu_ms is not None and tokens else float("nan")


@dataclass(frozen=True)
class Summary:
    n: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    tokens_per_chunk: float


@dataclass(frozen=True)
class Ratios:
    """Ours (the transformer) over a reference; > 1 means slower through the transformer."""

    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    ttft_added_ms: float  # ours TTFT p50 - reference TTFT p50

    @property
    def meets_goals(self) -> bool:
        return (self.ttft_p50 <= GOAL_TTFT_RATIO and self.ttft_added_ms <= GOAL_TTFT_ADDED_MS
                and self.itl_p50 <= GOAL_ITL_RATIO)


def summarize(samples: Sequence[Sample]) -> Summary:
    ttfts = [s.ttft_ms for s in samples]
    itls = [s.itl_ms for s in samples if s.itl_ms == s.itl_ms]  # drop nan (1-token answers)
    chunks = sum(s.chunks for s in samples)
    return Summary(
        len(samples), _percentile(ttfts, 0.5), _percentile(ttfts, 0.99),
        _percentile(itls, 0.5), _percentile(itls, 0.99),
        sum(s.tokens for s in samples) / chunks if chunks else float("nan"),
    )


def ratios(ours: Summary, ref: Summary) -> Ratios:
    return Ratios(
        ours.ttft_p50_ms / ref.ttft_p50_ms, ours.ttft_p99_ms / ref.ttft_p99_ms,
        ours.itl_p50_ms / ref.itl_p50_ms, ours.itl_p99_ms / ref.itl_p99_ms,
        ours.ttft_p50_ms - ref.ttft_p50_ms,
    )


def sample_of(started: float, content_times: Sequence[float], tokens: int) -> Sample:
    """TTFT from the first content chunk; ITL over the tokens after it. `tokens` (from usage) may
    be 0 when a server sends no usage: then every content chunk counts as one token."""
    tokens = tokens or len(content_times)
    if not content_times:
        raise ValueError("no content in the stream")
    first, last = content_times[0], content_times[-1]
    itl = (last - first) * 1000.0 / (tokens - 1) if tokens > 1 else float("nan")
    return Sample((first - started) * 1000.0, itl, tokens, len(content_times))


# ---------------------------------------------------------------------------------------------
# Client


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> tuple[Sample, str]:
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    content_times: list[float] = []
    tokens = 0
    started = time.perf_counter()
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        status = resp.headers.get("x-semserve-cache", "direct")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            # The clock first: JSON parsing must not sit between the bytes and their timestamp.
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                content_times.append(now)
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return sample_of(started, content_times, tokens), status


async def run_cell(cell: Cell, client: httpx.AsyncClient, url: str, prompts: Sequence[str],
                   max_tokens: int, expected: str) -> None:
    """Closed loop of `cell.concurrency` workers over `prompts`; only answers with the expected
    cache status count (a fail-open bypass would skip the lookup and flatter the transformer)."""
    queue = list(reversed(prompts))

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            try:
                sample, status = await stream_one(client, url, prompt, max_tokens)
            except Exception as e:
                cell.errors += 1
                if cell.errors <= 3:
                    print(f"    error ({cell.target} c={cell.concurrency}): {e!r}"[:300], flush=True)
                continue
            cell.statuses[status] += 1
            if status == expected:
                cell.samples.append(sample)

    await asyncio.gather(*(worker() for _ in range(cell.concurrency)))


def _client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    return httpx.AsyncClient(timeout=600, limits=limits)


@dataclass(frozen=True)
class Plan:
    """Prompts per level, fixed up front: the direct cell's prompts go to vLLM too."""

    levels: list[int]
    per_level: dict[int, int]
    transformer: dict[int, list[str]]
    direct: dict[int, list[str]]


def make_plan(levels: Sequence[int], requests: Sequence[int], seed: int) -> Plan:
    rng = random.Random(seed)
    per = dict(zip(levels, requests, strict=True))
    # A random tag on top of miss_prompts' number: unique across runs too, so a Redis left over
    # from another run cannot turn a "miss" into a hit.
    tag = f"{rng.randrange(16**6):06x}"
    t = {c: [f"{p} ({tag}-t{c}-{i})" for i, p in enumerate(miss_prompts(n, rng))] for c, n in per.items()}
    d = {c: [f"{p} ({tag}-d{c}-{i})" for i, p in enumerate(miss_prompts(n, rng))] for c, n in per.items()}
    return Plan(list(levels), per, t, d)


def waves(prompts: Sequence[str], size: int) -> list[list[str]]:
    return [list(prompts[i : i + size]) for i in range(0, len(prompts), size)]


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process `pid` has used so far."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def transformer_vs_direct(t_base: str, d_url: str, plan: Plan, max_tokens: int,
                                cpu_s: Callable[[], float] | None = None) -> list[Cell]:
    """`cpu_s`: the transformer's CPU seconds so far (its cells then report CPU per token)."""
    cells: list[Cell] = []
    t_url = f"{t_base}/openai/v1/chat/completions"
    for c in plan.levels:
        tc, dc = Cell("transformer", c), Cell("direct", c)
        async with _client(c) as client:
            await _warm_up(client, (t_url, d_url), max_tokens)
            # The lookup's share of the added TTFT: the transformer's own lookup timer.
            stats = ServerStats(client, t_base)
            before = await stats.snapshot()
            # One wave of c requests per side at a time, the order swapped every wave, so neither
            # side always runs right after the other's burst.
            pairs = zip(waves(plan.transformer[c], c), waves(plan.direct[c], c), strict=True)
            for i, (tw, dw) in enumerate(pairs):
                steps = [(tc, t_url, tw, "miss"), (dc, d_url, dw, "direct")]
                for cell, url, prompts, expected in steps if i % 2 == 0 else reversed(steps):
                    cpu_before = cpu_s() if cpu_s is not None and cell is tc else None
                    await run_cell(cell, client, url, prompts, max_tokens, expected)
                    if cpu_before is not None and cpu_s is not None:
                        tc.cpu_ms = (tc.cpu_ms or 0.0) + (cpu_s() - cpu_before) * 1000
            tc.lookup_ms = stats.mean_ms(before, await stats.snapshot(), "semserve_cache_lookup_seconds_")
        for cell in (tc, dc):
            _progress(cell)
        cells += [tc, dc]
    return cells


async def vllm_cells(url: str, plan: Plan, max_tokens: int) -> list[Cell]:
    cells = []
    for c in plan.levels:
        cell = Cell("vllm", c)
        async with _client(c) as client:
            await _warm_up(client, (url,), max_tokens)
            for wave in waves(plan.direct[c], c):
                await run_cell(cell, client, url, wave, max_tokens, "direct")
        _progress(cell)
        cells.append(cell)
    return cells


async def _warm_up(client: httpx.AsyncClient, urls: Sequence[str], max_tokens: int) -> None:
    # Connections, lazy paths, the first lookups/stores: not what a steady miss costs.
    for url in urls:
        for i in range(2):
            await stream_one(client, url, f"Warm-up request {i}, {random.random()}.", max_tokens)


def _progress(cell: Cell) -> None:
    s = cell.summary
    print(f"  {cell.target:<11} c={cell.concurrency:<3} n={s.n:<4} TTFT p50 {s.ttft_p50_ms:7.1f} ms "
          f"p99 {s.ttft_p99_ms:7.1f} ms  ITL p50 {s.itl_p50_ms:6.2f} ms p99 {s.itl_p99_ms:6.2f} ms  "
          f"statuses {dict(cell.statuses)} errors {cell.errors}", flush=True)


# ---------------------------------------------------------------------------------------------
# Tables


def _f(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def latency_table(cells: Sequence[Cell]) -> str:
    rows = [
        "| target | concurrency | n | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens/chunk "
        "| lookup mean ms | transformer CPU ms/token | statuses / errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in cells:
        s = cell.summary
        note = ", ".join(f"{k} {v}" for k, v in sorted(cell.statuses.items()))
        if cell.errors:
            note += f", errors {cell.errors}"
        rows.append(f"| {cell.target} | {cell.concurrency} | {s.n} | {_f(s.ttft_p50_ms)} | "
                    f"{_f(s.ttft_p99_ms)} | {_f(s.itl_p50_ms, 2)} | {_f(s.itl_p99_ms, 2)} | "
                    f"{_f(s.tokens_per_chunk, 2)} | {_f(cell.lookup_ms or float('nan'), 2)} | "
                    f"{_f(cell.cpu_ms_per_token, 3)} | {note or '-'} |")
    return "\n".join(rows)


def ratio_table(cells: Sequence[Cell]) -> tuple[str, list[str]]:
    rows = [
        "| concurrency | vs | TTFT p50 ratio | TTFT p99 ratio | TTFT p50 ms added | ITL p50 ratio "
        "| ITL p99 ratio | goal (TTFT p50 <= 1.10x and <= 10 ms added, ITL p50 <= 1.05x) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    missed: list[str] = []
    by = {(c.target, c.concurrency): c.summary for c in cells}
    for (target, conc), ours in by.items():
        if target != "transformer":
            continue
        for ref_name in ("direct", "vllm"):
            ref = by.get((ref_name, conc))
            if ref is None or not ours.n or not ref.n:
                continue
            r = ratios(ours, ref)
            # The goals are set against direct (same engine, same process); vLLM is context.
            verdict = ("PASS" if r.meets_goals else "not yet") if ref_name == "direct" else "-"
            if ref_name == "direct" and not r.meets_goals:
                missed.append(f"c={conc} vs direct: TTFT p50 {r.ttft_p50:.2f}x ({r.ttft_added_ms:+.1f} ms; "
                              f"goals {GOAL_TTFT_RATIO:.2f}x, {GOAL_TTFT_ADDED_MS:g} ms), ITL p50 "
                              f"{r.itl_p50:.2f}x (goal {GOAL_ITL_RATIO:.2f}x)")
            rows.append(f"| {conc} | {ref_name} | {r.ttft_p50:.2f} | {r.ttft_p99:.2f} | "
                        f"{r.ttft_added_ms:+.1f} | {r.itl_p50:.2f} | {r.itl_p99:.2f} | {verdict} |")
    return "\n".join(rows), missed


# ---------------------------------------------------------------------------------------------
# Processes and main


def parse_levels(concurrency: str, requests: str) -> tuple[list[int], list[int]]:
    """`--requests 16,32,64` gives one count per level; one number is used for every level; 0
    means 4 x concurrency, at least 8 (as `semserve bench predictor`)."""
    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    counts = [int(x) for x in requests.split(",") if x.strip()] or [0]
    if len(counts) == 1:
        counts *= len(levels)
    if len(counts) != len(levels):
        raise ValueError(f"--requests has {len(counts)} counts for {len(levels)} levels")
    return levels, [n or max(8, 4 * c) for n, c in zip(counts, levels, strict=True)]


def interval_args(interval: int) -> list[str]:
    """The same --stream-interval for every server of a run (vLLM's default, 1, as no flag)."""
    return ["--stream-interval", str(interval)] if interval > 1 else []


def _predictor_proc(
    model_dir: Path, max_seqs: int, http: int, grpc: int, cpus: frozenset[int] | None, interval: int = 1
) -> Proc:
    return Proc(
        "predictor",
        ["predictor", "--model", str(model_dir), "--http-port", str(http), "--grpc-port", str(grpc),
         "--max-num-seqs", str(max_seqs), "--log-level", "warning", *ENGINE_LIMITS, *interval_args(interval)],
        f"http://127.0.0.1:{http}/v2/health/ready", LOG_DIR / "stream-bench-predictor.log",
    )


def _transformer_proc(redis_url: str, predictor_grpc: int, http: int, grpc: int, interval: int = 1) -> Proc:
    # Only the predictor's gRPC address: every miss takes the ModelStreamInfer hop.
    return Proc(
        "transformer",
        ["transformer", "--http-port", str(http), "--grpc-port", str(grpc),
         "--predictor-host", f"127.0.0.1:{predictor_grpc}",
         "--cache-redis-url", redis_url, "--cache-deployment", "bench_stream", "--log-level", "warning",
         *interval_args(interval)],
        f"http://127.0.0.1:{http}/v2/health/ready", LOG_DIR / "stream-bench-transformer.log",
    )


def _vllm_server(
    model_dir: Path, max_seqs: int, port: int, cpus: frozenset[int] | None, interval: int = 1
) -> Server:
    import torch

    # What `semserve bench predictor` gives vLLM's server: the same limits our predictor runs with.
    default_util = "0.90" if torch.cuda.is_available() else "0.25"
    util = os.environ.get("SEMSERVE_BENCH_MEMORY_UTILIZATION") or default_util
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
           "--max-num-seqs", str(max_seqs), "--gpu-memory-utilization", util, *ENGINE_LIMITS,
           *interval_args(interval)]
    return Server("vllm", cmd, f"http://127.0.0.1:{port}", "/v1/models", LOG_DIR / "stream-bench-vllm.log",
                  cpus=cpus)


@dataclass
class Run:
    cells: list[Cell] = field(default_factory=list)
    predictor_start_s: float = float("nan")
    vllm_start_s: float = float("nan")


def _ours(run: Run, model_dir: Path, max_seqs: int, plan: Plan, max_tokens: int,
          engine_cpus: frozenset[int] | None, interval: int = 1) -> None:  # fmt: skip
    from semserve.tooling.local_redis import RedisServer

    redis_dir = Path(tempfile.mkdtemp(prefix="redis-stream-bench-", dir=LOG_DIR))
    redis = RedisServer(_free_port(), data_dir=redis_dir)
    p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
    predictor = _predictor_proc(model_dir, max_seqs, p_http, p_grpc, engine_cpus, interval)
    transformer: Proc | None = None
    try:
        redis.start()
        print(f"==> predictor (model {model_dir}, max_num_seqs {max_seqs})", flush=True)
        run.predictor_start_s = predictor.start().wait_ready()
        print("==> transformer (gRPC hop only)", flush=True)
        transformer = _transformer_proc(redis.url, p_grpc, t_http, t_grpc, interval)
        transformer.start().wait_ready(300)
        print("==> transformer vs direct, alternating waves", flush=True)
        assert transformer.proc is not None
        pid = transformer.proc.pid
        run.cells += asyncio.run(transformer_vs_direct(
            f"http://127.0.0.1:{t_http}",
            f"http://127.0.0.1:{p_http}/openai/v1/chat/completions", plan, max_tokens,
            lambda: process_cpu_s(pid),
        ))
    finally:
        if transformer is not None:
            transformer.stop()
        predictor.stop()
        redis.stop()


def _theirs(run: Run, model_dir: Path, max_seqs: int, plan: Plan, max_tokens: int,
            engine_cpus: frozenset[int] | None, interval: int = 1) -> None:  # fmt: skip
    server = _vllm_server(model_dir, max_seqs, _free_port(), engine_cpus, interval)
    print("==> vLLM's own OpenAI server", flush=True)
    with server:
        run.vllm_start_s = server.start_s
        run.cells += asyncio.run(vllm_cells(f"{server.base}/v1/chat/completions", plan, max_tokens))


def _order(cells: Sequence[Cell]) -> list[Cell]:
    return sorted(cells, key=lambda c: (c.concurrency, TARGETS.index(c.target)))


def section(args: argparse.Namespace, run: Run, max_seqs: int, minutes: float,
            loads: tuple[float, float], split: CoreSplit | None = None) -> str:
    cells = _order(run.cells)
    lat = latency_table(cells)
    rat, missed = ratio_table(cells)
    cmd = (f"flock /tmp/semserve-heavy.lock semserve bench stream --concurrency {args.concurrency} "
           f"--requests {args.requests} --max-tokens {args.max_tokens}"
           + (f" --engine-cpus {args.engine_cpus}" if split is not None else "")
           + (f" --stream-interval {args.stream_interval}" if args.stream_interval > 1 else ""))
    cores = (f" Cores: {split.describe()}." if split is not None
             else " Cores: every process on every CPU.")
    notes = "\n".join(f"- not met: {m}" for m in missed) or "- all goals met against direct"
    return (
        f"\n## Streaming miss through the transformer (gRPC hop) vs direct and vLLM "
        f"({time.strftime('%Y-%m-%d')}, {_machine()})\n\n"
        f"Command: `{cmd}` ({minutes:.1f} min). Streaming OpenAI chat, {args.max_tokens} output tokens "
        f"per request (ignore_eos), temperature 0, a new prompt every request (every transformer "
        f"request a miss: lookup, ModelStreamInfer to the predictor, store). `transformer` and "
        f"`direct` (the predictor's own /openai/v1/chat/completions) share one predictor and run in "
        f"alternating waves of `concurrency` requests; `vllm` is `python -m "
        f"vllm.entrypoints.openai.api_server` afterwards on the direct cell's prompts. Engine limits "
        f"for both: max_num_seqs {max_seqs}, max_model_len 2048, stream interval {args.stream_interval} "
        f"(every server). TTFT: first content chunk as the "
        f"client sees it; ITL: per request (last content chunk - first) / (tokens - 1), then p50/p99 "
        f"over requests. Transformer CPU ms/token: the transformer process's CPU time (all threads) during "
        f"its own waves over the tokens of its answers (what one of its cores can relay: 1000 / that "
        f"many tokens/s). Engine start: predictor {run.predictor_start_s:.0f} s, vLLM "
        f"{run.vllm_start_s:.0f} s. Shared machine: 1-min load average {loads[0]:.1f} at the start, "
        f"{loads[1]:.1f} at the end.{cores}\n\n{lat}\n\nTransformer over reference (> 1: slower through the "
        f"transformer):\n\n{rat}\n\n{notes}\n"
    )


def main(args: argparse.Namespace) -> int:
    from predictors.warm_start import use_cache_dirs
    from semserve import model_prep

    started, load_start = time.monotonic(), os.getloadavg()[0]
    levels, counts = parse_levels(str(args.concurrency), str(args.requests))
    plan = make_plan(levels, counts, args.seed)
    model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
    max_seqs = max(levels)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    # Both engines inherit the same compile caches and cache-relevant vLLM settings (warm starts).
    use_cache_dirs()
    run = Run()
    split = CoreSplit.from_flag(args.engine_cpus)
    if split is not None:
        split.pin_this_process()  # the transformer and Redis it starts inherit it
        print(f"==> {split.describe()}", flush=True)
    engine_cpus = split.engine if split is not None else None
    _ours(run, model_dir, max_seqs, plan, args.max_tokens, engine_cpus, args.stream_interval)
    if not args.skip_vllm:
        _theirs(run, model_dir, max_seqs, plan, args.max_tokens, engine_cpus, args.stream_interval)
    minutes = (time.monotonic() - started) / 60
    text = section(args, run, max_seqs, minutes, (load_start, os.getloadavg()[0]), split)
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            f.write(text)
        print(f"appended to {args.output}")
    return 1 if any(c.errors for c in run.cells) else 0
