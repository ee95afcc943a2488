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
import hashlib
import json
import random
import struct
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.predictor import ROOT, _free_port, _percentile

LOG_DIR = ROOT / ".cache" / "bench-logs"
MODEL = "llm"
MAX_TOKENS = 8
PATHS = ("v2-rest", "v2-grpc", "openai-completions", "openai-completions-stream", "openai-chat",
         "openai-chat-stream")
RSS_GROWTH_MAX = 0.10
FD_SLACK = 4
REQUEST_TIMEOUT_S = 120.0

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


@dataclass(frozen=True)
class Endpoint:
    http: str  # base URL
    grpc: str  # host:port


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


def _grpc_output(resp: Any, name: str) -> bytes | None:
    """The first element of a BYTES or INT32 output, raw (raw_output_contents or typed contents)."""
    for i, out in enumerate(resp.outputs):
        if out.name != name:
            continue
        if resp.raw_output_contents:
            raw = bytes(resp.raw_output_contents[i])
            if out.datatype == "BYTES":
                (n,) = struct.unpack_from("<I", raw, 0)
                return raw[4 : 4 + n]
            return raw[:4]
        if out.datatype == "BYTES":
            return bytes(out.contents.bytes_contents[0])
        return struct.pack("<i", out.contents.int_contents[0])
    return None


class Failure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class Served:
    """What the client got: cache status, text, and the end of the answer as the response told it."""

    status: str
    text: str
    finish_reason: str | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Sent:
    """One request as sent: what its answer may be checked against."""

    rid: str
    path: str
    op: str
    tenant: str
    kind: str  # "raw" (v2 and OpenAI completions share entries) or "chat"
    prompt: str
    accept: tuple[str, ...]  # prompts whose answers a semantic hit may carry


@dataclass(frozen=True)
class Generation:
    """One `generation_finished` line of the predictor's log."""

    request_id: str
    outcome: str
    finish_reason: str | None
    completion_tokens: int
    output_sha256: str


def read_generations(log_path: Path, prefix: str) -> dict[str, list[Generation]]:
    """The predictor's generations whose request id starts with `prefix`, by request id (a v2
    request's prompt i runs as `<id>-<i>`: filed under `<id>`)."""
    out: dict[str, list[Generation]] = defaultdict(list)
    with log_path.open(errors="replace") as f:
        for line in f:
            if "generation_finished" not in line or prefix not in line:
                continue
            try:
                e = json.loads(line)
            except ValueError:
                continue
            rid = str(e.get("request_id") or "")
            if e.get("event") != "generation_finished" or not rid.startswith(prefix):
                continue
            base = rid[: -len("-0")] if rid.endswith("-0") else rid
            out[base].append(Generation(rid, str(e.get("outcome")), e.get("finish_reason"),
                                        int(e.get("completion_tokens") or 0), str(e.get("output_sha256"))))
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Verdict:
    """The answer check over a whole run (see the module docstring)."""

    checked: int = 0
    misses_by_request: int = 0  # misses matched to the predictor's generation for that request
    misses_joined: int = 0  # misses without a generation of their own (single flight)
    hits: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    answers_per_prompt: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def fail(self, kind: str, detail: str) -> None:
        self.failures[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail}")

    @property
    def prompts_with_several_answers(self) -> int:
        return sum(1 for v in self.answers_per_prompt.values() if len(v) > 1)


def verify(served: list[tuple[Sent, Served]], sent: list[Sent],
           generations: dict[str, list[Generation]]) -> Verdict:
    v = Verdict()
    by_rid = {s.rid: s for s in sent}
    # What the predictor produced cleanly, per (tenant, kind, prompt), from every request sent,
    # answered or not (an answer stored by a request whose client gave up is still the model's).
    produced: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for rid, gens in generations.items():
        s = by_rid.get(rid)
        if s is None:
            continue
        for g in gens:
            if g.outcome == "ok" and g.finish_reason in ("stop", "length"):
                produced[(s.tenant, s.kind, s.prompt)].add(g.output_sha256)
    for s, got in served:
        v.checked += 1
        digest = _sha(got.text)
        v.answers_per_prompt.setdefault((s.kind, s.prompt), set()).add(digest)
        where = f"{s.path} {s.op} {got.status} tenant={s.tenant} rid={s.rid} {s.prompt!r}: {got.text!r}"
        if got.finish_reason not in (None, "stop", "length"):
            v.fail("partial_answer", f"{where} finish_reason={got.finish_reason}")
            continue
        if got.status == "miss":
            own = generations.get(s.rid, [])
            if own:
                v.misses_by_request += 1
                g = own[-1]
                if g.outcome != "ok" or g.finish_reason not in ("stop", "length"):
                    v.fail("partial_answer", f"{where}: the predictor's generation ended {g.outcome}/"
                                             f"{g.finish_reason}")
                elif g.output_sha256 != digest:
                    v.fail("wrong_answer", f"{where}: not the text the predictor generated for this "
                                           f"request ({g.completion_tokens} tokens, {g.finish_reason})")
                elif got.finish_reason is not None and got.finish_reason != g.finish_reason:
                    v.fail("wrong_answer", f"{where}: finish_reason {got.finish_reason}, the predictor's "
                                           f"{g.finish_reason}")
                elif got.completion_tokens is not None and got.completion_tokens != g.completion_tokens:
                    v.fail("partial_answer", f"{where}: {got.completion_tokens} completion tokens, the "
                                             f"predictor's {g.completion_tokens}")
                continue
            v.misses_joined += 1
            if digest not in produced[(s.tenant, s.kind, s.prompt)]:
                v.fail("wrong_answer", f"{where}: no generation of its own and no generation for this "
                                       f"tenant and prompt gave this text")
            continue
        v.hits += 1
        allowed = s.accept if got.status == "semantic" else (s.prompt,)
        if not any(digest in produced[(s.tenant, s.kind, p)] for p in allowed):
            v.fail("wrong_answer", f"{where}: the predictor never produced this text for this tenant and "
                                   f"{'these prompts' if len(allowed) > 1 else 'prompt'}")
    return v


class Client:
    def __init__(self, transformer: Endpoint) -> None:
        import grpc
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

        self.t, self.pb = transformer, pb
        self.http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S,
                                      limits=httpx.Limits(max_connections=128, max_keepalive_connections=64))
        self.channel = grpc.aio.insecure_channel(transformer.grpc)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()

    async def call(self, path: str, prompt: str, key: str | None, rid: str) -> Served:
        """One request through the transformer, carrying `rid` as its request id."""
        headers = {"x-request-id": rid}
        if key:
            headers["authorization"] = f"Bearer {key}"
        if path == "v2-rest":
            body = {"id": rid,
                    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                    "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
            r = await self.http.post(f"{self.t.http}/v2/models/{MODEL}/infer", json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            outs = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
            return Served(str(outs["cache_status"]), str(outs["text_output"]), outs.get("finish_reason"),
                          outs.get("completion_tokens"))
        if path == "v2-grpc":
            import grpc

            pb = self.pb
            req = pb.ModelInferRequest(
                model_name=MODEL, id=rid,
                inputs=[pb.ModelInferRequest.InferInputTensor(
                    name="text_input", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[prompt.encode()]))],
                parameters={"max_tokens": pb.InferParameter(int64_param=MAX_TOKENS),
                            "temperature": pb.InferParameter(int64_param=0)},
            )
            try:
                resp = await self.stub.ModelInfer(req, metadata=tuple(headers.items()),
                                                  timeout=REQUEST_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                raise Failure(f"grpc_{e.code().name}", str(e.details())[:200]) from e
            text = _grpc_output(resp, "text_output")
            if text is None:
                raise Failure("bad_response", "no text_output")
            finish = _grpc_output(resp, "finish_reason")
            tokens = _grpc_output(resp, "completion_tokens")
            return Served((_grpc_output(resp, "cache_status") or b"?").decode(), text.decode(),
                          finish.decode() if finish is not None else None,
                          struct.unpack("<i", tokens)[0] if tokens is not None else None)
        chat = path.startswith("openai-chat")
        stream = path.endswith("-stream")
        body: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        url = f"{self.t.http}/openai/v1/{'chat/completions' if chat else 'completions'}"
        if not stream:
            r = await self.http.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            return Served(r.headers.get("x-semserve-cache", "?"), str(text or ""),
                          choice.get("finish_reason"), (data.get("usage") or {}).get("completion_tokens"))
        parts: list[str] = []
        done = False
        finish: str | None = None
        tokens: int | None = None
        async with self.http.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", (await r.aread()).decode(errors="replace")[:200])
            status = r.headers.get("x-semserve-cache", "?")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise Failure("stream_error", data[:200])
                if event.get("usage"):
                    tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices", []):
                    piece = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if piece:
                        parts.append(piece)
                    finish = choice.get("finish_reason") or finish
        if not done:
            raise Failure("stream_truncated", "no [DONE]")
        if finish is None:
            raise Failure("stream_truncated", "no chunk carried a finish_reason")
        return Served(status, "".join(parts), finish, tokens)


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


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


def main(args: argparse.Namespace) -> int:
    from bench.cache import Proc
    from semserve.loadbalancer import Backend, Frontend, LoadBalancer
    from semserve.tooling.local_redis import RedisServer
    from transformers_svc.auth import hash_key

    duration = parse_duration(args.duration)
    keys = dict(kv.split("=", 1) for kv in args.api_key)
    pids = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.pid)}
    procs: list[Proc] = []
    redis: RedisServer | None = None
    lb: LoadBalancer | None = None
    try:
        if args.transformer or args.predictor_log:
            if not (args.transformer and args.transformer_grpc and args.predictor_log):
                raise SystemExit("--transformer, --transformer-grpc and --predictor-log go together")
            t = Endpoint(args.transformer.rstrip("/"), args.transformer_grpc)
            predictor_log = Path(args.predictor_log)
        else:
            from semserve import model_prep

            LOG_DIR.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="soak-", dir=LOG_DIR))
            keys = {f"tenant{i}": f"soak-key-{i}-{random.randrange(10**9)}" for i in range(args.tenants)}
            (work / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
            redis = RedisServer(_free_port(), data_dir=work / "redis").start()
            p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
            predictor_log = LOG_DIR / "soak-predictor.log"
            model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
            pred = Proc(
                "predictor",
                ["predictor", "--model", str(model_dir), "--http-port", str(p_http),
                 "--grpc-port", str(p_grpc), "--max-num-seqs", str(max(32, args.concurrency)),
                 # Info: its `generation_finished` lines are what every answer is checked against.
                 "--max-model-len", "2048", "--log-level", "info"],
                f"http://127.0.0.1:{p_http}/v2/health/ready", predictor_log,
            )
            procs.append(pred.start())
            pred.wait_ready()
            # One transformer on t_http/t_grpc, or --transformers N replicas behind nginx there.
            n = max(1, args.transformers)
            ports = [(t_http, t_grpc)] if n == 1 else [(_free_port(), _free_port()) for _ in range(n)]
            replicas = [
                Proc(
                    "transformer" if n == 1 else f"transformer-{i}",
                    ["transformer", "--http-port", str(http), "--grpc-port", str(grpc),
                     "--predictor-host", f"127.0.0.1:{p_grpc}",
                     "--cache-redis-url", redis.url, "--cache-deployment", "soak",
                     "--api-keys-file", str(work / "keys.json"), "--log-level", "warning"],
                    f"http://127.0.0.1:{http}/v2/health/ready",
                    LOG_DIR / ("soak-transformer.log" if n == 1 else f"soak-transformer-{i}.log"),
                )
                for i, (http, grpc) in enumerate(ports)
            ]
            for proc in replicas:  # all at once, as pods of one deployment start
                procs.append(proc.start())
            for proc in replicas:
                proc.wait_ready(300)
            if n > 1:
                lb = LoadBalancer(Frontend(t_http, t_grpc, work / "nginx"),
                                  [Backend(http, grpc) for http, grpc in ports]).start()
                _wait_http(f"http://127.0.0.1:{t_http}/v2/health/ready", 30)
            t = Endpoint(f"http://127.0.0.1:{t_http}", f"127.0.0.1:{t_grpc}")
            assert pred.proc is not None and redis.process is not None
            pids = {"predictor": pred.proc.pid, "redis": redis.process.pid}
            pids.update({p.name: p.proc.pid for p in replicas if p.proc is not None})
        report = asyncio.run(soak(t, duration, args.concurrency, predictor_log, keys or None, pids,
                                  window_s=args.window, seed=args.seed))
    finally:
        if lb is not None:
            lb.stop()
        for proc in reversed(procs):
            proc.stop()
        if redis is not None:
            redis.stop()
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
