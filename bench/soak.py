"""`semserve bench soak`: bounded mixed load against the transformer, checked for correctness,
errors and resource growth.

Loopback only. Either starts its own stack (Redis with RediSearch, the predictor and a transformer
with an API keys file, all on free ports; `--transformers N`: N replicas behind nginx, as prod's
replicas behind a Service) or uses running ones (`--transformer URL`
with `--transformer-grpc`, `--api-key TENANT=KEY`, and `--pid NAME=PID` for the
resource samples), checking answers against `--predictor-log` (the predictor's JSON log, at level
info). `--concurrency` closed-loop workers run for `--duration`, each request drawn from:

  ops        exact (a small pool of prompts sent again and again: hits once stored), paraphrase
             (rewordings of the pool: semantic hits where the verifier accepts them), miss (a fresh
             prompt each time)
  paths      v2-rest, v2-grpc, openai-completions, openai-completions-stream, openai-chat,
             openai-chat-stream
  tenants    several API keys, one tenant each (entries are per tenant)

All traffic is temperature 0 and every served answer is checked against what the predictor
itself produced, from the predictor's own `generation_finished` log lines (request id, finish
reason, tokens, SHA-256 of the whole answer; `--predictor-log`, or the log of the started stack):
  miss       the text served is byte for byte the predictor's answer to that very request (found by
             the x-request-id the transformer forwards), and that generation ended cleanly (stop or
             length, never aborted); a miss that joined another's in-flight call (single flight)
             must carry a text the predictor produced for the same tenant and prompt
  hit        the text is one the predictor produced for a request of the same tenant with that
             prompt (a semantic hit: or with the prompt it paraphrases)
Greedy decoding on the CPU backend depends a little on the batch a request runs in, so the same
prompt can get different (each complete) answers at different times; the report counts prompts
that did. Every `--window` seconds: requests, errors by kind, p50/p99 per path, and RSS + open
file descriptors of each server process (psutil, children included).

Pass: zero errors (HTTP/gRPC failures, timeouts, wrong or partial answers), RSS growth after warm-up < 10 %,
no fd growth (final count, after the clients closed, at most the post-warm-up count + `FD_SLACK`).
Exit status 1 on failure.

    .venv/bin/semserve bench soak --duration 3m --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.predictor import _percentile
from bench.soak_client import REQUEST_TIMEOUT_S, Client, Endpoint, Failure
from bench.soak_stack import LocalStack
from bench.soak_verify import Sent, Served, Verdict, read_generations, verify

PATHS = ("v2-rest", "v2-grpc", "openai-completions", "openai-completions-stream", "openai-chat",
         "openai-chat-stream")
RSS_GROWTH_MAX = 0.10
FD_SLACK = 4

# (stored prompt, paraphrase): the exact pool is the first column.
POOL = (
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How many legs does a spider have?", "How many legs do spiders have?"),
    ("What color is the sky on a clear day?", "What colour is the sky on a clear day?"),
    ("Who wrote Romeo and Juliet?", "Who is the author of Romeo and Juliet?"),
    ("What is the boiling point of water in Celsius?", "At what temperature in Celsius does water boil?"),
    ("Name a primary color.", "Name one primary color."),
    ("What is the largest planet in the solar system?", "Which planet is the largest in the solar system?"),
    ("How do you say hello in Spanish?", "How does one say hello in Spanish?"),
)
_TOPICS = ("a lighthouse", "autumn leaves", "a red bicycle", "the moon", "a glacier", "fresh bread",
           "a steam train", "coral reefs", "an old clock", "city pigeons")



@dataclass
class Window:
    start_s: float
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    resources: dict[str, tuple[float, int]] = field(default_factory=dict)  # name -> (RSS MiB, fds)

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + sum(self.errors.values())


@dataclass
class SoakReport:
    duration_s: float
    concurrency: int
    windows: list[Window]
    errors: Counter[str]
    error_samples: list[str]
    statuses: Counter[str]
    latencies: dict[str, list[float]]
    baseline: dict[str, tuple[float, int]]  # after warm-up
    final: dict[str, tuple[float, int]]  # after the clients closed
    peak_after_warmup: dict[str, tuple[float, int]]
    failures: list[str]
    verdict: Verdict
    failed: list[tuple[Sent, str]] = field(default_factory=list)  # unanswered requests, error kind

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + sum(self.errors.values())

    @property
    def passed(self) -> bool:
        return not self.failures


def _resources(pids: dict[str, int]) -> dict[str, tuple[float, int]]:
    import psutil

    out: dict[str, tuple[float, int]] = {}
    for name, pid in pids.items():
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        rss, fds = 0, 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                fds += p.num_fds()
            except psutil.Error:
                pass
        out[name] = (rss / 2**20, fds)
    return out



async def soak(
    transformer: Endpoint, duration_s: float, concurrency: int, predictor_log: Path,
    keys: dict[str, str] | None = None, pids: dict[str, int] | None = None, window_s: float = 10.0,
    warmup_s: float | None = None, seed: int = 0, out: Callable[[str], None] = print,
    stop: asyncio.Event | None = None,
) -> SoakReport:
    """Run the load; `keys`: tenant -> API key (None: no auth); `pids`: name -> server pid;
    `predictor_log`: the predictor's JSON log, read at the end to check every answer; `stop`: ends
    the load before `duration_s` when set (fault tests end it once recovery is shown)."""
    rng = random.Random(seed)
    run_id = f"soak-{uuid.uuid4().hex[:8]}"
    tenants = list((keys or {"default": ""}).items())
    pids = pids or {}
    warmup = warmup_s if warmup_s is not None else max(window_s, min(60.0, 0.2 * duration_s))
    client = Client(transformer)
    started = time.monotonic()
    windows = [Window(0.0)]
    totals: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    samples: list[str] = []
    sent: list[Sent] = []
    served: list[tuple[Sent, Served]] = []
    failed: list[tuple[Sent, str]] = []  # requests that got no answer, with the error kind
    counter = 0

    def record_error(kind: str, detail: str) -> None:
        errors[kind] += 1
        windows[-1].errors[kind] += 1
        if len(samples) < 10:
            samples.append(f"{kind}: {detail}")
            out(f"  error {kind}: {detail}")

    async def one() -> bool:
        """One request; False when it got no answer."""
        nonlocal counter
        counter += 1
        path = rng.choice(PATHS)
        kind = "chat" if path.startswith("openai-chat") else "raw"
        tenant, key = rng.choice(tenants)
        r = rng.random()
        base, para = rng.choice(POOL)
        if r < 0.5:
            op, prompt, accept = "exact", base, (base, para)
        elif r < 0.7:
            op, prompt, accept = "paraphrase", para, (para, base)
        else:
            topic = rng.choice(_TOPICS)
            prompt = f"Write one short sentence about {topic}, case {counter}-{rng.randrange(10**6)}."
            op, accept = "miss", (prompt,)
        request = Sent(f"{run_id}-{counter}", path, op, tenant, kind, prompt, accept)
        sent.append(request)
        t0 = time.perf_counter()
        try:
            got = await asyncio.wait_for(client.call(path, prompt, key or None, request.rid),
                                         REQUEST_TIMEOUT_S)
        except Failure as e:
            record_error(e.kind, f"{path} {op}: {e}")
            failed.append((request, e.kind))
            return False
        except (TimeoutError, httpx.TimeoutException):
            record_error("timeout", f"{path} {op}")
            failed.append((request, "timeout"))
            return False
        except (httpx.HTTPError, OSError) as e:
            record_error("transport", f"{path} {op}: {e!r}"[:200])
            failed.append((request, "transport"))
            return False
        ms = (time.perf_counter() - t0) * 1000
        served.append((request, got))
        statuses[f"{op}:{got.status}"] += 1
        windows[-1].statuses[got.status] += 1
        windows[-1].latencies[path].append(ms)
        totals[path].append(ms)
        return True

    async def worker() -> None:
        while time.monotonic() - started < duration_s and not (stop is not None and stop.is_set()):
            if not await one():
                await asyncio.sleep(0.2)  # a client backs off after an error; no busy loop on 503s

    def report_window(w: Window) -> None:
        cells = "  ".join(f"{p} {_percentile(v, 0.5):.0f}/{_percentile(v, 0.99):.0f}"
                          for p, v in sorted(w.latencies.items()))
        res = "  ".join(f"{n} {rss:.0f}MiB/{fds}fd" for n, (rss, fds) in w.resources.items())
        out(f"  [{w.start_s:5.0f}s] req {w.requests:5d} err {sum(w.errors.values())} "
            f"{dict(w.statuses)} | p50/p99 ms {cells} | {res}")

    async def sampler() -> None:
        while True:
            await asyncio.sleep(window_s)
            w = windows[-1]
            w.resources = _resources(pids)
            report_window(w)
            windows.append(Window(time.monotonic() - started))

    out(f"soak {run_id}: {duration_s:.0f}s, concurrency {concurrency}, tenants {len(tenants)}, "
        f"warm-up {warmup:.0f}s, servers {sorted(pids)}")
    first = _resources(pids)
    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        sampling.cancel()
        await client.close()
    windows[-1].resources = _resources(pids)
    report_window(windows[-1])
    await asyncio.sleep(2.0)  # let closed connections go (and the last log lines be written)
    final = _resources(pids)
    elapsed = time.monotonic() - started

    out(f"checking {len(served)} answers against the predictor's generations in {predictor_log}")
    verdict = verify(served, sent, read_generations(predictor_log, run_id))
    for kind, n in verdict.failures.items():
        errors[kind] += n
    samples.extend(verdict.samples[: max(0, 10 - len(samples))])

    after = [w for w in windows if w.start_s + window_s >= warmup and w.resources]
    baseline = after[0].resources if after else first
    peak: dict[str, tuple[float, int]] = {}
    for name in pids:
        vals = [w.resources[name] for w in after if name in w.resources]
        vals += [final[name]] if name in final else []
        if vals:
            peak[name] = (max(v[0] for v in vals), max(v[1] for v in vals))
    failures: list[str] = []
    if errors:
        failures.append(f"{sum(errors.values())} errors: {dict(errors)}")
    if not any(totals.values()):
        failures.append("no request answered")
    if served and not verdict.misses_by_request and any(got.status == "miss" for _, got in served):
        failures.append(f"no miss could be matched to a generation in {predictor_log}: is it the "
                        f"predictor's log, at level info?")
    for name, (rss0, fds0) in baseline.items():
        if name not in final:
            failures.append(f"{name}: process gone")
            continue
        rss1, fds1 = final[name]
        grown = max(rss1, peak.get(name, (rss1, 0))[0]) / rss0 - 1 if rss0 else 0.0
        # Redis holds the entries the load stores: its RSS grows with data, by design (reported only).
        if grown >= RSS_GROWTH_MAX and name != "redis":
            failures.append(f"{name}: RSS grew {grown:.1%} after warm-up ({rss0:.0f} -> peak "
                            f"{peak[name][0]:.0f} MiB)")
        if fds1 > fds0 + FD_SLACK:
            failures.append(f"{name}: open fds {fds0} after warm-up -> {fds1} at the end")
    return SoakReport(elapsed, concurrency, windows, errors, samples, statuses, dict(totals), baseline,
                      final, peak, failures, verdict, failed)


def summary(report: SoakReport) -> str:
    lines = [
        "| path | requests | p50 ms | p99 ms |",
        "| --- | --- | --- | --- |",
    ]
    for path in PATHS:
        v = report.latencies.get(path, [])
        if v:
            lines.append(f"| {path} | {len(v)} | {_percentile(v, 0.5):.0f} | {_percentile(v, 0.99):.0f} |")
    lines += ["",
              "| server | RSS after warm-up MiB | RSS peak MiB | RSS end MiB | fds after warm-up | fds end |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name, (rss0, fds0) in report.baseline.items():
        rss1, fds1 = report.final.get(name, (float("nan"), -1))
        lines.append(f"| {name} | {rss0:.0f} | {report.peak_after_warmup.get(name, (rss1, 0))[0]:.0f} | "
                     f"{rss1:.0f} | {fds0} | {fds1} |")
    lines += ["", f"requests {report.requests} in {report.duration_s:.0f} s "
              f"({report.requests / max(report.duration_s, 1e-9):.1f}/s), errors {dict(report.errors) or 0}",
              f"outcomes (op:cache status): {dict(sorted(report.statuses.items()))}",
              f"answers checked against the predictor's own generations: {report.verdict.checked} "
              f"(misses matched to their request's generation {report.verdict.misses_by_request}, "
              f"misses that joined an in-flight call {report.verdict.misses_joined}, hits "
              f"{report.verdict.hits}); wrong or partial: {sum(report.verdict.failures.values())}",
              f"prompts answered with more than one (complete) text over the run (batch-dependent "
              f"greedy decoding on CPU): {report.verdict.prompts_with_several_answers} of "
              f"{len(report.verdict.answers_per_prompt)}",
              "PASS" if report.passed else "FAIL: " + "; ".join(report.failures)]
    return "\n".join(lines)


def parse_duration(text: str) -> float:
    text = text.strip().lower()
    for suffix, mult in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * mult
    return float(text)



def main(args: argparse.Namespace) -> int:
    duration = parse_duration(args.duration)
    keys = dict(kv.split("=", 1) for kv in args.api_key)
    pids = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.pid)}
    stack = LocalStack()
    try:
        if args.transformer or args.predictor_log:
            if not (args.transformer and args.transformer_grpc and args.predictor_log):
                raise SystemExit("--transformer, --transformer-grpc and --predictor-log go together")
            t = Endpoint(args.transformer.rstrip("/"), args.transformer_grpc)
            predictor_log = Path(args.predictor_log)
        else:
            stack.start(args.model, args.tenants, args.concurrency, args.transformers)
            assert stack.endpoint is not None and stack.predictor_log is not None
            t, predictor_log, keys, pids = stack.endpoint, stack.predictor_log, stack.keys, stack.pids
        report = asyncio.run(soak(t, duration, args.concurrency, predictor_log, keys or None, pids,
                                  window_s=args.window, seed=args.seed))
    finally:
        stack.stop()
    text = summary(report)
    print()
    print(text)
    if args.output:
        with open(args.output, "a") as f:
            cmd = f"semserve bench soak --duration {args.duration} --concurrency {args.concurrency}"
            if args.transformers > 1:
                cmd += f" --transformers {args.transformers}"
            f.write(f"\n```\n{cmd}\n{text}\n```\n")
    return 0 if report.passed else 1
