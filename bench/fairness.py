"""`semserve bench fairness`: a quiet tenant beside a noisy one on one predictor, fair admission
(transformers_svc/fair_queue.py) on and off in the same run (issue 27 item 8).

One run starts Redis, one predictor (`--max-num-seqs`, small by default so that the noisy tenant
alone saturates it) and two transformers on it, both with the same API keys and limits file
(weights quiet 2 : noisy 1): one with fair admission (the default), one with --no-fair-admission.
Then, each for `--duration` seconds, closed-loop streaming OpenAI chat, fresh prompts (every
request a miss), ignore_eos so answers are as long as asked:

  quiet solo     quiet alone (c=1, short answers)                     TTFT reference
  noisy solo     noisy alone (c=32, long answers)                     throughput reference
  mixed on/off   both, through the fair / the plain transformer       quiet TTFT, noisy throughput
  shares on/off  both tenants backlogged (each c=32, long answers)    each tenant's share of tokens

Tokens are counted as they stream in (content chunks within the phase, times the tokens per chunk
the answers' usage reports), so answers cut at a phase's end count for what arrived; shares are
counted over a phase's second half, when both tenants are backlogged. Between phases the clients
leave (the predictor aborts) and the predictor is let drain.

    flock /tmp/semserve-heavy.lock .venv/bin/semserve bench fairness --output bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.cache_e2e import miss_prompts
from bench.predictor import _free_port, _machine, _percentile
from bench.procs import LOG_DIR, Proc

MODEL = "llm"
WEIGHTS = {"quiet": 2.0, "noisy": 1.0}
GOAL_TTFT = 1.5
GOAL_SHARE_ERROR = 0.10
GOAL_THROUGHPUT = 0.8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=30.0, help="seconds per phase (six phases)")
    p.add_argument("--max-num-seqs", type=int, default=8,
                   help="the predictor's batch: small, so the noisy tenant alone saturates it")
    p.add_argument("--quiet-tokens", type=int, default=8, help="the quiet tenant's answer length")
    p.add_argument("--noisy-tokens", type=int, default=32,
                   help="the noisy tenant's answer length (4x quiet's: long enough to be noisy, short "
                   "enough that a phase on this CPU sees several rounds of the predictor's batch)")
    p.add_argument("--noisy-concurrency", type=int, default=32)
    p.add_argument("--transformer-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the fair transformer (repeatable), "
                   "e.g. --transformer-arg=--fair-max-waiting=4")
    p.add_argument("--reserve", type=int, default=None,
                   help="also a mixed phase through a third transformer with --fair-reserve N (the fair "
                   "one has the transformer's default, 1), e.g. 0: the quiet tenant without a reserved place")
    p.add_argument("--vllm-priority", action="store_true",
                   help="then vLLM's own server with --scheduling-policy priority: the mixed load straight "
                   "to it, one priority for both tenants and quiet's first (issue 27: does it help?)")
    p.add_argument("--model", default=None, help="HF model dir (default: the prepared SmolLM2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="append the markdown section to this file")


@dataclass
class Tenant:
    """One tenant's traffic in one phase, as its clients saw it."""

    name: str
    ttft_ms: list[float] = field(default_factory=list)
    chunks: int = 0  # content chunks that arrived within the phase
    late_chunks: int = 0  # those of its second half (both tenants backlogged by then)
    answered_tokens: int = 0  # usage of the answers that completed
    answered_chunks: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # status -> count (429/503)
    errors: int = 0

    def tokens(self, late: bool = False) -> float:
        per_chunk = self.answered_tokens / self.answered_chunks if self.answered_chunks else 1.0
        return (self.late_chunks if late else self.chunks) * per_chunk


@dataclass
class Phase:
    name: str
    tenants: dict[str, Tenant]
    seconds: float = 0.0
    queue_wait_s: dict[str, float] = field(default_factory=dict)  # mean time in the fair queue
    engine_waiting: list[float] = field(default_factory=list)  # the predictor's own queue, once a second


class Load:
    """Closed-loop clients of one server. `priority` (vLLM's own server with --scheduling-policy
    priority): a `priority` per tenant in each body, lower first."""

    def __init__(self, base: str, keys: dict[str, str], seed: int, path: str = "/openai/v1/chat/completions",
                 priority: dict[str, int] | None = None) -> None:
        self.base = base
        self.url = f"{base}{path}"
        self.keys = keys
        self.priority = priority
        self.rng = random.Random(seed)
        self.tag = f"{self.rng.randrange(16**6):06x}"
        self.n = 0
        self.second_half = 0.0  # when the running phase's second half starts

    def prompt(self, tenant: str) -> str:
        self.n += 1
        return f"{miss_prompts(1, self.rng)[0]} ({self.tag}-{tenant}-{self.n})"

    async def one(self, client: httpx.AsyncClient, t: Tenant, max_tokens: int, end: float) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": self.prompt(t.name)}],
                "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.priority is not None:
            body["priority"] = self.priority[t.name]
        started = time.monotonic()
        first = True
        chunks = 0
        key = self.keys.get(t.name)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with client.stream("POST", self.url, json=body, headers=headers) as resp:
            if resp.status_code in (429, 503):
                t.refused[resp.status_code] = t.refused.get(resp.status_code, 0) + 1
                await asyncio.sleep(min(5.0, float(resp.headers.get("retry-after", "1"))))
                return
            if resp.status_code != 200:
                await resp.aread()
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.monotonic()
                chunk = json.loads(line[6:])
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    if now <= end:
                        t.chunks += 1
                        chunks += 1
                        t.late_chunks += now >= self.second_half
                    if first:
                        first = False
                        if now <= end:
                            t.ttft_ms.append((now - started) * 1000)
                if chunk.get("usage") and now <= end:
                    t.answered_tokens += int(chunk["usage"]["completion_tokens"])
                    t.answered_chunks += chunks

    async def tenant(self, client: httpx.AsyncClient, t: Tenant, concurrency: int, max_tokens: int,
                     end: float) -> None:
        async def worker() -> None:
            while time.monotonic() < end:
                try:
                    await self.one(client, t, max_tokens, end)
                except Exception as e:
                    t.errors += 1
                    if t.errors <= 3:
                        print(f"    error ({t.name}): {e!r}"[:300], flush=True)

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        for task in tasks:  # the phase is over: clients leave, the predictor aborts their generations
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def queue_waits(client: httpx.AsyncClient, base: str) -> dict[str, tuple[float, float]]:
    """Per tenant (sum, count) of semserve_admission_queue_seconds."""
    text = (await client.get(f"{base}/metrics")).text
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, idx in (("semserve_admission_queue_seconds_sum{", 0),
                          ("semserve_admission_queue_seconds_count{", 1)):
            if line.startswith(part):
                tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
                out.setdefault(tenant, [0.0, 0.0])[idx] = float(line.rsplit(" ", 1)[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def engine_waiting(text: str) -> float:
    """vllm:num_requests_waiting from a Prometheus page (all engines)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_waiting{"))


async def sample_engine_queue(client: httpx.AsyncClient, predictor_http: str, into: list[float],
                              end: float) -> None:
    """The requests waiting in the predictor's own (first come, first served) queue, once a second:
    fair admission holds it near --fair-max-waiting; without it the whole backlog waits there."""
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            into.append(engine_waiting((await client.get(f"{predictor_http}/metrics")).text))
        await asyncio.sleep(1.0)


async def drained(client: httpx.AsyncClient, predictor_http: str, timeout_s: float = 60) -> None:
    """Wait until the predictor runs nothing (aborted generations gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (await client.get(f"{predictor_http}/metrics")).text
        busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting{")))
        if busy == 0:
            return
        await asyncio.sleep(0.5)


# name, clients, {tenant: (concurrency, max_tokens)}
Plan = list[tuple[str, Load, dict[str, tuple[int, int]]]]


async def phases(args: argparse.Namespace, fair: str, plain: str, reserve: str | None, predictor_http: str,
                 keys: dict[str, str]) -> list[Phase]:
    bases = [b for b in (fair, plain, reserve) if b is not None]
    loads = {base: Load(base, keys, args.seed + i) for i, base in enumerate(bases)}
    q, n, nc = args.quiet_tokens, args.noisy_tokens, args.noisy_concurrency
    plan: Plan = [
        ("quiet solo", loads[fair], {"quiet": (1, q)}),
        ("noisy solo", loads[fair], {"noisy": (nc, n)}),
        ("mixed, fair on", loads[fair], {"quiet": (1, q), "noisy": (nc, n)}),
        ("mixed, fair off", loads[plain], {"quiet": (1, q), "noisy": (nc, n)}),
        *([(f"mixed, fair on, reserve {args.reserve}", loads[reserve], {"quiet": (1, q), "noisy": (nc, n)})]
          if reserve is not None else []),
        # noisy's clients start first: quiet's larger share must not come from arriving first.
        ("shares, fair on", loads[fair], {"noisy": (nc, n), "quiet": (nc, n)}),
        ("shares, fair off", loads[plain], {"noisy": (nc, n), "quiet": (nc, n)}),
    ]
    return await run_plan(args, plan, predictor_http)


async def vllm_priority_phases(args: argparse.Namespace, base: str) -> list[Phase]:
    """vLLM's own server with --scheduling-policy priority, no transformer: the same mixed load
    with one priority for both tenants (first come, first served) and with quiet's first."""
    q, n, nc = args.quiet_tokens, args.noisy_tokens, args.noisy_concurrency
    path = "/v1/chat/completions"
    plan: Plan = [
        ("vLLM priority: quiet solo", Load(base, {}, args.seed + 10, path, {"quiet": 0}), {"quiet": (1, q)}),
        ("vLLM priority: mixed, same", Load(base, {}, args.seed + 11, path, {"quiet": 0, "noisy": 0}),
         {"quiet": (1, q), "noisy": (nc, n)}),
        ("vLLM priority: mixed, quiet first", Load(base, {}, args.seed + 12, path, {"quiet": 0, "noisy": 1}),
         {"quiet": (1, q), "noisy": (nc, n)}),
    ]
    return await run_plan(args, plan, base)


async def run_plan(args: argparse.Namespace, plan: Plan, predictor_http: str) -> list[Phase]:
    out = []
    nc = args.noisy_concurrency
    limits = httpx.Limits(max_connections=2 * nc + 8, max_keepalive_connections=2 * nc + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for load in {id(load): load for _, load, _ in plan}.values():  # warm: connections, first lookups
            await Load(load.base, load.keys, 99, load.url[len(load.base):], load.priority).one(
                client, Tenant("quiet"), 4, time.monotonic() + 60)
        for name, load, traffic in plan:
            await drained(client, predictor_http)
            phase = Phase(name, {t: Tenant(t) for t in traffic})
            base = load.base
            before = await queue_waits(client, base)
            started = time.monotonic()
            end = started + args.duration
            load.second_half = started + args.duration / 2
            await asyncio.gather(*(load.tenant(client, phase.tenants[t], c, m, end)
                                   for t, (c, m) in traffic.items()),
                                 sample_engine_queue(client, predictor_http, phase.engine_waiting, end))
            phase.seconds = time.monotonic() - started
            after = await queue_waits(client, base)
            for t, (s, c) in after.items():
                s0, c0 = before.get(t, (0.0, 0.0))
                if c > c0:
                    phase.queue_wait_s[t] = (s - s0) / (c - c0)
            _progress(phase, args.duration)
            out.append(phase)
    return out


def _progress(p: Phase, duration: float) -> None:
    parts = []
    for t in p.tenants.values():
        parts.append(f"{t.name}: TTFT p50 {_percentile(t.ttft_ms, 0.5):.0f} ms "
                     f"p99 {_percentile(t.ttft_ms, 0.99):.0f} ms (n={len(t.ttft_ms)}), "
                     f"{t.tokens() / duration:.1f} tok/s, refused {t.refused}, "
                     f"errors {t.errors}, queue {p.queue_wait_s.get(t.name, float('nan')):.2f} s")
    print(f"  {p.name:<17} " + " | ".join(parts) + f" | predictor queue {_engine_queue(p)}", flush=True)


def _engine_queue(p: Phase) -> str:
    w = p.engine_waiting
    return f"{statistics.fmean(w):.1f} / {max(w):.0f}" if w else "-"


# ---------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, ps: list[Phase], minutes: float, loads: tuple[float, float],
           predictor_start_s: float, vllm_start_s: float = float("nan")) -> str:
    by = {p.name: p for p in ps}
    d = args.duration

    def ttft(phase: str, q: float) -> float:
        return _percentile(by[phase].tenants["quiet"].ttft_ms, q)

    def tput(phase: str) -> float:
        return by[phase].tenants["noisy"].tokens() / d

    def share(phase: str) -> float:
        ts = by[phase].tenants
        total = ts["quiet"].tokens(late=True) + ts["noisy"].tokens(late=True)
        return ts["quiet"].tokens(late=True) / total if total else float("nan")

    want = WEIGHTS["quiet"] / sum(WEIGHTS.values())
    rows = ["| phase | quiet TTFT p50 ms | p99 ms | x solo p50 | x solo p99 | noisy tok/s | x solo "
            "| quiet share of tokens (weight 0.67) | mean fair-queue wait quiet / noisy s "
            "| predictor's own queue mean / max | refused 429/503 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in ps:
        has_n = "noisy" in p.tenants
        has_q = "quiet" in p.tenants and not p.name.startswith("shares")  # there quiet is noisy too
        solo = "vLLM priority: quiet solo" if p.name.startswith("vLLM") else "quiet solo"
        solo_q50, solo_q99 = ttft(solo, 0.5), ttft(solo, 0.99)
        q50 = ttft(p.name, 0.5) if has_q else float("nan")
        q99 = ttft(p.name, 0.99) if has_q else float("nan")
        nt = tput(p.name) if has_n else float("nan")
        sh = share(p.name) if p.name.startswith("shares") else float("nan")  # both backlogged
        refused = sum(t.refused.get(429, 0) for t in p.tenants.values())
        unavailable = sum(t.refused.get(503, 0) for t in p.tenants.values())
        waits = " / ".join(_f(p.queue_wait_s.get(t, float("nan")), 2) for t in ("quiet", "noisy"))
        rows.append(f"| {p.name} | {_f(q50, 0)} | {_f(q99, 0)} | {_f(q50 / solo_q50, 2)} "
                    f"| {_f(q99 / solo_q99, 2)} | {_f(nt)} | {_f(nt / tput('noisy solo'), 2)} | {_f(sh, 3)} "
                    f"| {waits} | {_engine_queue(p)} | {refused}/{unavailable} |")
    on_ttft = ttft("mixed, fair on", 0.5) / ttft("quiet solo", 0.5)
    on_share = share("shares, fair on")
    on_tput = tput("mixed, fair on") / tput("noisy solo")
    goals = [
        f"quiet TTFT p50 with fair on {on_ttft:.2f}x solo (goal <= {GOAL_TTFT}x): "
        f"{'met' if on_ttft <= GOAL_TTFT else 'not met'}",
        f"quiet share of tokens, both backlogged, fair on {on_share:.3f} vs weight {want:.3f} (goal within "
        f"{GOAL_SHARE_ERROR:.0%}): {'met' if abs(on_share - want) <= GOAL_SHARE_ERROR * want else 'not met'}",
        f"noisy throughput beside quiet, fair on {on_tput:.2f}x solo (goal >= {GOAL_THROUGHPUT}x): "
        f"{'met' if on_tput >= GOAL_THROUGHPUT else 'not met'}",
    ]
    if "vLLM priority: mixed, same" in by:
        same_p, first_p = "vLLM priority: mixed, same", "vLLM priority: mixed, quiet first"
        same, first = ttft(same_p, 0.5), ttft(first_p, 0.5)
        goals.append(
            f"vLLM's priority scheduling alone (its own server, no transformer): quiet TTFT p50 "
            f"{first / same:.2f}x with quiet's requests first against one priority for both ({first:.0f} "
            f"vs {same:.0f} ms); noisy tok/s {tput(first_p):.1f} vs {tput(same_p):.1f} (noisy's x solo in "
            "these rows is against our predictor's noisy solo)")
    extra = " ".join(f"--transformer-arg={a}" for a in args.transformer_arg)
    cmd = (f"flock /tmp/semserve-heavy.lock .venv/bin/semserve bench fairness --duration {d:g} "
           f"--max-num-seqs {args.max_num_seqs} --quiet-tokens {args.quiet_tokens} --noisy-tokens "
           f"{args.noisy_tokens} --noisy-concurrency {args.noisy_concurrency} "
           f"{'' if args.reserve is None else f'--reserve {args.reserve} '}"
           f"{'--vllm-priority ' if args.vllm_priority else ''}"
           f"{extra}").strip()
    return (
        f"\n### Fairness run ({time.strftime('%Y-%m-%d %H:%M')}, {_machine()})\n\n"
        f"Command: `{cmd}` ({minutes:.1f} min, predictor start {predictor_start_s:.0f} s). One predictor "
        f"(max_num_seqs {args.max_num_seqs}), two transformers on it with the same keys and limits "
        f"(weights quiet 2 : noisy 1), one with fair admission (defaults{', ' + extra if extra else ''}), "
        f"one with --no-fair-admission; {d:g} s per phase, streaming chat, fresh prompts (all misses), "
        f"ignore_eos. quiet: c=1, {args.quiet_tokens} tokens; noisy: c={args.noisy_concurrency}, "
        f"{args.noisy_tokens} tokens; in the shares phases both tenants send noisy's load."
        + (f" The vLLM priority rows: vLLM's own server (`--scheduling-policy priority`, max_num_seqs "
           f"{args.max_num_seqs}, started after the others stopped, {vllm_start_s:.0f} s), clients "
           "straight to it, `priority` in the body (lower first)." if args.vllm_priority else "")
        + " Load average "
        f"{loads[0]:.1f} at the start, {loads[1]:.1f} at the end.\n\n" + "\n".join(rows) + "\n\n"
        + "\n".join(f"- {g}" for g in goals) + "\n"
    )


def _f(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def main(args: argparse.Namespace) -> int:
    from predictors.warm_start import use_cache_dirs
    from semserve import model_prep
    from semserve.tooling.local_redis import RedisServer
    from transformers_svc.auth import hash_key

    started, load_start = time.monotonic(), os.getloadavg()[0]
    model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    use_cache_dirs()
    work = Path(tempfile.mkdtemp(prefix="fairness-bench-", dir=LOG_DIR))
    keys = {t: f"bench-key-{t}" for t in WEIGHTS}
    (work / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
    (work / "limits.json").write_text(json.dumps({t: {"weight": w} for t, w in WEIGHTS.items()}))
    redis = RedisServer(_free_port(), data_dir=work / "redis")
    p_http, p_grpc = _free_port(), _free_port()
    predictor = Proc("predictor", [
        "predictor", "--model", str(model_dir), "--http-port", str(p_http), "--grpc-port", str(p_grpc),
        "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048", "--log-level", "warning",
    ], f"http://127.0.0.1:{p_http}/v2/health/ready", LOG_DIR / "fairness-bench-predictor.log")
    transformers: list[Proc] = []
    try:
        redis.start()
        print(f"==> predictor (max_num_seqs {args.max_num_seqs})", flush=True)
        predictor_start_s = predictor.start().wait_ready()
        bases = []
        variants = [("fair", list(args.transformer_arg)), ("plain", ["--no-fair-admission"])]
        if args.reserve is not None:
            variants.append(("reserve", [*args.transformer_arg, f"--fair-reserve={args.reserve}"]))
        for name, extra in variants:
            http, grpc = _free_port(), _free_port()
            proc = Proc(f"transformer-{name}", [
                "transformer", "--http-port", str(http), "--grpc-port", str(grpc),
                "--predictor-host", f"127.0.0.1:{p_grpc}", "--predictor-metrics-url",
                f"http://127.0.0.1:{p_http}/metrics", "--cache-redis-url", redis.url,
                "--cache-deployment", f"bench_fair_{name}", "--api-keys-file", str(work / "keys.json"),
                "--tenant-limits-file", str(work / "limits.json"), "--log-level", "warning", *extra,
            ], f"http://127.0.0.1:{http}/v2/health/ready", LOG_DIR / f"fairness-bench-{name}.log")
            transformers.append(proc.start())
            bases.append(f"http://127.0.0.1:{http}")
        for proc in transformers:
            proc.wait_ready(300)
        print(f"==> phases, {args.duration:g} s each", flush=True)
        reserve = bases[2] if args.reserve is not None else None
        ps = asyncio.run(phases(args, bases[0], bases[1], reserve, f"http://127.0.0.1:{p_http}", keys))
    finally:
        for proc in transformers:
            proc.stop()
        predictor.stop()
        redis.stop()
    vllm_start_s = float("nan")
    if args.vllm_priority:
        port = _free_port()
        vllm = Proc("vllm", [
            "--model", str(model_dir), "--served-model-name", MODEL, "--host", "127.0.0.1",
            "--port", str(port),
            "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048",
            "--gpu-memory-utilization", os.environ.get("SEMSERVE_BENCH_MEMORY_UTILIZATION", "0.25"),
            "--scheduling-policy", "priority",
        ], f"http://127.0.0.1:{port}/v1/models", LOG_DIR / "fairness-bench-vllm.log",
            module="vllm.entrypoints.openai.api_server")
        try:
            print("==> vLLM's own server, --scheduling-policy priority", flush=True)
            vllm_start_s = vllm.start().wait_ready()
            ps += asyncio.run(vllm_priority_phases(args, f"http://127.0.0.1:{port}"))
        finally:
            vllm.stop()
    minutes = (time.monotonic() - started) / 60
    text = report(args, ps, minutes, (load_start, os.getloadavg()[0]), predictor_start_s, vllm_start_s)
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            f.write(text)
        print(f"appended to {args.output}")
    return 1 if any(t.errors for p in ps for t in p.tenants.values()) else 0
