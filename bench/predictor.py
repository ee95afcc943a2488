"""`semserve bench predictor`: our predictor against vLLM's own OpenAI server, same everything.

Both servers run in this process tree, one after the other (running them side by side on a small
machine would make each the other's noise), on the same model, engine limits, prompts and
concurrency. Load is streaming chat completions with a fixed output length (ignore_eos), so both do
identical work; we time the first content chunk (TTFT) and count tokens from `usage`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from semserve import model_prep
from semserve.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [
    "Explain how a refrigerator works.",
    "Write a short poem about the sea.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle for a child.",
    "Give three tips for learning a new language.",
    "Summarize the plot of a detective story you invent.",
    "How do airplanes stay in the air?",
    "List some healthy breakfast ideas.",
]


@dataclass
class LevelResult:
    server: str
    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    errors: int


def _free_port() -> int:
    return free_port()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def pinned(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that puts a child on `cpus` (None: where its parent is)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


class Server:
    def __init__(
        self, name: str, cmd: list[str], base: str, ready_path: str, log: Path,
        cpus: frozenset[int] | None = None,
    ) -> None:  # fmt: skip
        self.name, self.cmd, self.base, self.ready_path, self.log = name, cmd, base, ready_path, log
        self.cpus = cpus  # None: where this process runs
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            preexec_fn=pinned(self.cpus),
        )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(self.base + self.ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > 900:
                raise TimeoutError(f"{self.name} not ready in 900 s; see {self.log}")
            print(f"  [{self.name}] starting... {time.monotonic() - started:.0f}s", end="\r", flush=True)
            time.sleep(1)
        self.start_s = time.monotonic() - started
        print(f"  [{self.name}] ready in {self.start_s:.0f}s            ", flush=True)
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int):
    body = {
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    ttft = None
    tokens = 0
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.monotonic() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft if ttft is not None else time.monotonic() - started, tokens


async def _level(server: Server, url: str, model: str, concurrency: int, requests: int,
                 max_tokens: int) -> LevelResult:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(PROMPTS[i % len(PROMPTS)])
    ttfts: list[float] = []
    total_tokens = 0
    errors = 0
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        # Warm-up: one request so the first measured one doesn't pay lazy initialisation.
        await _one(client, url, model, PROMPTS[0], 4)

        async def worker() -> None:
            nonlocal total_tokens, errors
            while not queue.empty():
                prompt = queue.get_nowait()
                try:
                    ttft, tokens = await _one(client, url, model, prompt, max_tokens)
                    ttfts.append(ttft)
                    total_tokens += tokens
                except Exception:
                    errors += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.monotonic() - started
    return LevelResult(
        server.name, concurrency, requests, total_tokens, seconds, total_tokens / seconds,
        _percentile(ttfts, 0.5), _percentile(ttfts, 0.99), errors,
    )


def run_server(server: Server, url: str, model: str, levels: list[int], per_level: int,
               max_tokens: int) -> list[LevelResult]:
    out = []
    with server:
        for c in levels:
            n = per_level or max(8, 4 * c)
            print(f"  [{server.name}] concurrency {c}: {n} requests x {max_tokens} tokens", flush=True)
            result = asyncio.run(_level(server, url, model, c, n, max_tokens))
            print(f"  [{server.name}]   {result.tokens_per_s:.0f} tok/s, TTFT p50 "
                  f"{result.ttft_p50_s * 1000:.0f} ms, errors {result.errors}", flush=True)
            out.append(result)
    return out


def table(ours: list[LevelResult], theirs: list[LevelResult]) -> str:
    rows = [
        "| concurrency | ours tok/s | vLLM tok/s | ratio | ours TTFT p50/p99 ms | vLLM TTFT p50/p99 ms "
        "| TTFT p50 ratio | errors ours/vLLM |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(ours, theirs, strict=True):
        rows.append(
            f"| {a.concurrency} | {a.tokens_per_s:.0f} | {b.tokens_per_s:.0f} | "
            f"{a.tokens_per_s / b.tokens_per_s:.2f} | "
            f"{a.ttft_p50_s * 1000:.0f} / {a.ttft_p99_s * 1000:.0f} | "
            f"{b.ttft_p50_s * 1000:.0f} / {b.ttft_p99_s * 1000:.0f} | "
            f"{a.ttft_p50_s / b.ttft_p50_s:.2f} | {a.errors}/{b.errors} |"
        )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    levels = [int(x) for x in str(args.concurrency).split(",") if x]
    model_dir = Path(args.model) if args.model else model_prep.prepare().model_dir
    max_seqs = max(levels)
    common = ["--max-model-len", "2048"]
    log_dir = ROOT / ".cache" / "bench-logs"
    p_ours, g_ours, p_vllm = _free_port(), _free_port(), _free_port()
    ours = Server(
        "semserve",
        [sys.executable, "-m", "semserve", "predictor", "--model", str(model_dir),
         "--http-port", str(p_ours), "--grpc-port", str(g_ours), "--max-num-seqs", str(max_seqs),
         "--log-level", "warning", *common],
        f"http://127.0.0.1:{p_ours}", "/v2/health/ready", log_dir / "semserve.log",
    )
    util = os.environ.get("SEMSERVE_BENCH_MEMORY_UTILIZATION", "")
    vllm_cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "llm", "--host", "127.0.0.1", "--port", str(p_vllm),
        "--max-num-seqs", str(max_seqs), *common,
    ]
    import torch

    vllm_cmd += ["--gpu-memory-utilization", util or ("0.90" if torch.cuda.is_available() else "0.25")]
    theirs = Server("vllm", vllm_cmd, f"http://127.0.0.1:{p_vllm}", "/v1/models", log_dir / "vllm.log")
    print(f"==> semserve predictor (model {model_dir})", flush=True)
    ours_r = run_server(ours, f"{ours.base}/openai/v1/chat/completions", "llm", levels,
                        args.requests_per_level, args.max_tokens)
    print("==> vLLM OpenAI server (python -m vllm.entrypoints.openai.api_server)", flush=True)
    theirs_r = run_server(theirs, f"{theirs.base}/v1/chat/completions", "llm", levels,
                          args.requests_per_level, args.max_tokens)
    text = table(ours_r, theirs_r)
    print()
    print(text)
    print(f"\nengine start: ours {ours.start_s:.0f} s, vLLM {theirs.start_s:.0f} s")
    if args.output:
        cmd = "semserve bench predictor " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in
            (("concurrency", args.concurrency), ("max_tokens", args.max_tokens)) if v is not None
        )
        with open(args.output, "a") as f:
            f.write(
                f"\n## Predictor vs vLLM ({time.strftime('%Y-%m-%d')}, {_machine()})\n\n"
                f"Command: `{cmd}`. Streaming chat, {args.max_tokens} output tokens per request "
                f"(ignore_eos), temperature 0, max_num_seqs {max_seqs}. Engine start: ours "
                f"{ours.start_s:.0f} s, vLLM {theirs.start_s:.0f} s.\n\n{text}\n"
            )
    if args.profile:
        profile = {
            "name": f"measured-{model_dir.name}",
            # The simulator calls a CPU pod's seconds pod-seconds, not GPU-seconds.
            "accelerator": "gpu" if Path("/dev/nvidia0").exists() else "cpu",
            "concurrency": [r.concurrency for r in ours_r],
            "tokens_per_s": [round(r.tokens_per_s, 1) for r in ours_r],
            "ttft_s": [round(r.ttft_p50_s, 3) for r in ours_r],
            "max_num_seqs": max_seqs,
            "startup": {"warmup_s": [round(ours.start_s, 1), round(ours.start_s, 1)]},
            "results": [asdict(r) for r in ours_r + theirs_r],
        }
        Path(args.profile).write_text(json.dumps(profile, indent=1))
    return 0 if all(r.errors == 0 for r in ours_r + theirs_r) else 1


def _machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return f"CPU, {os.cpu_count()} cores"
