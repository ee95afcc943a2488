"""`semserve bench soak`: bounded mixed load against the transformer, checked for correctness,
errors and resource growth.

Loopback only. Either starts its own stack (Redis with RediSearch, the predictor and a transformer
with an API keys file, all on free ports) or uses running ones (`--transformer URL --predictor URL`
with `--transformer-grpc`, `--predictor-grpc`, `--api-key TENANT=KEY`, and `--pid NAME=PID` for the
resource samples). `--concurrency` closed-loop workers run for `--duration`, each request drawn from:

  ops        exact (a small pool of prompts sent again and again: hits once stored), paraphrase
             (rewordings of the pool: semantic hits where the verifier accepts them), miss (a fresh
             prompt each time)
  paths      v2-rest, v2-grpc, openai-completions, openai-completions-stream, openai-chat,
             openai-chat-stream
  tenants    several API keys, one tenant each (entries are per tenant)

All traffic is temperature 0, so every answer is checked against the reference text: the predictor's
own answer for that prompt (asked directly, once per prompt). A semantic hit may carry the answer of
the prompt it paraphrases. Every `--window` seconds: requests, errors by kind, p50/p99 per path,
and RSS + open file descriptors of each server process (psutil, children included).

Pass: zero errors (HTTP/gRPC failures, timeouts, wrong answers), RSS growth after warm-up < 10 %,
no fd growth (final count, after the clients closed, at most the post-warm-up count + `FD_SLACK`).
Exit status 1 on failure.

    .venv/bin/semserve bench soak --duration 3m --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import struct
import tempfile
import time
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
    divergent_misses: int = 0  # misses whose (whole) text differs from the direct answer

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


def _grpc_bytes(resp: Any, name: str) -> str | None:
    for i, out in enumerate(resp.outputs):
        if out.name != name:
            continue
        if resp.raw_output_contents:
            raw = resp.raw_output_contents[i]
            (n,) = struct.unpack_from("<I", raw, 0)
            return bytes(raw[4 : 4 + n]).decode()
        return bytes(out.contents.bytes_contents[0]).decode()
    return None


class Failure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class Client:
    def __init__(self, transformer: Endpoint, predictor: Endpoint) -> None:
        import grpc
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

        self.t, self.p, self.pb = transformer, predictor, pb
        self.http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S,
                                      limits=httpx.Limits(max_connections=128, max_keepalive_connections=64))
        self.channel = grpc.aio.insecure_channel(transformer.grpc)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self._refs: dict[tuple[str, str], asyncio.Future[str]] = {}
        # Texts the predictor returned through the transformer on misses, per (kind, prompt).
        self.seen: dict[tuple[str, str], set[str]] = {}

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()

    # -- references, straight from the predictor, once per prompt

    async def reference(self, kind: str, prompt: str) -> str:
        key = (kind, prompt)
        if key not in self._refs:
            fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._refs[key] = fut
            try:
                fut.set_result(await self._ask_predictor(kind, prompt))
            except Exception as e:
                del self._refs[key]
                fut.set_exception(e)
                fut.exception()  # retrieved: no "never retrieved" warning
                raise Failure("reference", repr(e)) from e
        return await asyncio.shield(self._refs[key])

    async def _ask_predictor(self, kind: str, prompt: str) -> str:
        if kind == "raw":
            body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                    "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
            r = await self.http.post(f"{self.p.http}/v2/models/{MODEL}/infer", json=body)
            r.raise_for_status()
            return str(next(o for o in r.json()["outputs"] if o["name"] == "text_output")["data"][0])
        r = await self.http.post(f"{self.p.http}/openai/v1/chat/completions", json={
            "model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}]})
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"])

    # -- one request through the transformer: (cache status, text)

    async def call(self, path: str, prompt: str, key: str | None) -> tuple[str, str]:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        if path == "v2-rest":
            body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
                    "parameters": {"max_tokens": MAX_TOKENS, "temperature": 0}}
            r = await self.http.post(f"{self.t.http}/v2/models/{MODEL}/infer", json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            outs = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
            return str(outs["cache_status"]), str(outs["text_output"])
        if path == "v2-grpc":
            import grpc

            pb = self.pb
            req = pb.ModelInferRequest(
                model_name=MODEL,
                inputs=[pb.ModelInferRequest.InferInputTensor(
                    name="text_input", datatype="BYTES", shape=[1],
                    contents=pb.InferTensorContents(bytes_contents=[prompt.encode()]))],
                parameters={"max_tokens": pb.InferParameter(int64_param=MAX_TOKENS),
                            "temperature": pb.InferParameter(int64_param=0)},
            )
            try:
                resp = await self.stub.ModelInfer(req, metadata=tuple(headers.items()) or None,
                                                  timeout=REQUEST_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                raise Failure(f"grpc_{e.code().name}", str(e.details())[:200]) from e
            return _grpc_bytes(resp, "cache_status") or "?", _grpc_bytes(resp, "text_output") or ""
        chat = path.startswith("openai-chat")
        stream = path.endswith("-stream")
        body: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        url = f"{self.t.http}/openai/v1/{'chat/completions' if chat else 'completions'}"
        if not stream:
            r = await self.http.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise Failure(f"http_{r.status_code}", r.text[:200])
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            return r.headers.get("x-semserve-cache", "?"), str(text)
        parts: list[str] = []
        done = False
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
                for choice in event.get("choices", []):
                    piece = choice.get("delta", {}).get("content") if chat else choice.get("text")
                    if piece:
                        parts.append(piece)
        if not done:
            raise Failure("stream_truncated", "no [DONE]")
        return status, "".join(parts)


async def soak(
    transformer: Endpoint, predictor: Endpoint, duration_s: float, concurrency: int,
    keys: dict[str, str] | None = None, pids: dict[str, int] | None = None, window_s: float = 10.0,
    warmup_s: float | None = None, seed: int = 0, out: Callable[[str], None] = print,
) -> SoakReport:
    """Run the load; `keys`: tenant -> API key (None: no auth); `pids`: name -> server pid."""
    rng = random.Random(seed)
    tenants = list((keys or {"default": ""}).items())
    pids = pids or {}
    warmup = warmup_s if warmup_s is not None else max(window_s, min(60.0, 0.2 * duration_s))
    client = Client(transformer, predictor)
    started = time.monotonic()
    windows = [Window(0.0)]
    totals: dict[str, list[float]] = defaultdict(list)
    errors: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    samples: list[str] = []
    divergent: list[str] = []
    counter = 0

    def record_error(kind: str, detail: str) -> None:
        errors[kind] += 1
        windows[-1].errors[kind] += 1
        if len(samples) < 10:
            samples.append(f"{kind}: {detail}")
            out(f"  error {kind}: {detail}")

    async def one() -> None:
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
        t0 = time.perf_counter()
        try:
            status, text = await asyncio.wait_for(client.call(path, prompt, key or None), REQUEST_TIMEOUT_S)
        except Failure as e:
            record_error(e.kind, f"{path} {op}: {e}")
            return
        except (TimeoutError, httpx.TimeoutException):
            record_error("timeout", f"{path} {op}")
            return
        except (httpx.HTTPError, OSError) as e:
            record_error("transport", f"{path} {op}: {e!r}"[:200])
            return
        ms = (time.perf_counter() - t0) * 1000
        # Which texts are right: the prompt's own answer; a semantic hit may carry its kin's. The
        # predictor's greedy answer depends a little on the batch it ran in (CPU backend), so what
        # it returned on a miss (the text then stored) is also its answer for that prompt.
        allowed = accept if status == "semantic" else (prompt,)
        try:
            refs = [await client.reference(kind, p) for p in allowed]
        except Failure as e:
            record_error(e.kind, str(e))
            return
        known = set(refs).union(*(client.seen.get((kind, p), set()) for p in allowed))
        if text not in known:
            detail = f"{path} {op} {status} tenant={tenant} {prompt!r}: {text!r} not in {sorted(known)!r}"
            if status != "miss" or any(ref.startswith(text) for ref in refs):
                # A hit serving a text the predictor never gave, or a cut-off answer.
                record_error("wrong_answer" if status != "miss" else "partial_answer", detail)
                return
            divergent.append(detail)
            if len(divergent) <= 3:
                out(f"  predictor answer differs from its direct one (batch-dependent): {detail}")
        if status == "miss":
            client.seen.setdefault((kind, prompt), set()).add(text)
        statuses[f"{op}:{status}"] += 1
        windows[-1].statuses[status] += 1
        windows[-1].latencies[path].append(ms)
        totals[path].append(ms)

    async def worker() -> None:
        while time.monotonic() - started < duration_s:
            await one()

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

    out(f"soak: {duration_s:.0f}s, concurrency {concurrency}, tenants {len(tenants)}, "
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
    await asyncio.sleep(2.0)  # let closed connections go
    final = _resources(pids)
    elapsed = time.monotonic() - started

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
                      final, peak, failures, len(divergent))


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
              f"misses whose text differs from the predictor's direct answer (batch-dependent greedy "
              f"decoding on CPU; served and stored as the predictor gave them): {report.divergent_misses}",
              "PASS" if report.passed else "FAIL: " + "; ".join(report.failures)]
    return "\n".join(lines)


def parse_duration(text: str) -> float:
    text = text.strip().lower()
    for suffix, mult in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(suffix) and text[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(text[: -len(suffix)]) * mult
    return float(text)


def main(args: argparse.Namespace) -> int:
    from bench.cache import Proc
    from cache.redis_server import RedisServer
    from transformers_svc.auth import hash_key

    duration = parse_duration(args.duration)
    keys = dict(kv.split("=", 1) for kv in args.api_key)
    pids = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.pid)}
    procs: list[Proc] = []
    redis: RedisServer | None = None
    try:
        if args.transformer or args.predictor:
            if not (args.transformer and args.predictor and args.transformer_grpc):
                raise SystemExit("--transformer, --transformer-grpc and --predictor go together")
            t = Endpoint(args.transformer.rstrip("/"), args.transformer_grpc)
            p = Endpoint(args.predictor.rstrip("/"), args.predictor_grpc or "")
        else:
            from semserve import model_prep

            LOG_DIR.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="soak-", dir=LOG_DIR))
            keys = {f"tenant{i}": f"soak-key-{i}-{random.randrange(10**9)}" for i in range(args.tenants)}
            (work / "keys.json").write_text(json.dumps({t: [hash_key(k)] for t, k in keys.items()}))
            redis = RedisServer(_free_port(), data_dir=work / "redis").start()
            p_http, p_grpc, t_http, t_grpc = (_free_port() for _ in range(4))
            model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
            pred = Proc(
                "predictor",
                ["predictor", "--model", str(model_dir), "--http-port", str(p_http),
                 "--grpc-port", str(p_grpc), "--max-num-seqs", str(max(32, args.concurrency)),
                 "--max-model-len", "2048",
                 "--log-level", "warning"],
                f"http://127.0.0.1:{p_http}/v2/health/ready", LOG_DIR / "soak-predictor.log",
            )
            procs.append(pred.start())
            pred.wait_ready()
            trans = Proc(
                "transformer",
                ["transformer", "--http-port", str(t_http), "--grpc-port", str(t_grpc),
                 "--predictor-host", f"127.0.0.1:{p_grpc}", "--predictor-url", f"http://127.0.0.1:{p_http}",
                 "--cache-redis-url", redis.url, "--cache-deployment", "soak",
                 "--api-keys-file", str(work / "keys.json"), "--log-level", "warning"],
                f"http://127.0.0.1:{t_http}/v2/health/ready", LOG_DIR / "soak-transformer.log",
            )
            procs.append(trans.start())
            trans.wait_ready(300)
            t = Endpoint(f"http://127.0.0.1:{t_http}", f"127.0.0.1:{t_grpc}")
            p = Endpoint(f"http://127.0.0.1:{p_http}", f"127.0.0.1:{p_grpc}")
            assert pred.proc is not None and trans.proc is not None and redis.process is not None
            pids = {"predictor": pred.proc.pid, "transformer": trans.proc.pid, "redis": redis.process.pid}
        report = asyncio.run(soak(t, p, duration, args.concurrency, keys or None, pids,
                                  window_s=args.window, seed=args.seed))
    finally:
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
            f.write(f"\n```\n{cmd}\n{text}\n```\n")
    return 0 if report.passed else 1
