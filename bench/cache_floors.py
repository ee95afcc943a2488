"""The hit paths against their floors, in the same run of `semserve bench cache` (issue 26).

  semantic, c=1   our semantic hit (v2 REST, v2 gRPC) vs the bare forward of the same embedder in a
                  separate process (bench/embed_peer.py), rounds alternated: hit p50 - forward p50
                  and the ratio
  semantic, c=32  32 concurrent semantic hits: p50(c=32) / p50(c=1)
  exact, c=1      our exact hit vs a bare ASGI app on uvicorn (REST) and a bare grpc.aio server
                  (gRPC) answering the same client with a body of the same size
                  (bench/bare_peers.py), rounds alternated: ours p50 / peer p50

Each peer runs in its own process; the servers of the bench are idle while a peer round runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.cache_clients import MODEL, Clients, Target
from bench.cache_e2e import PROTOCOLS, Cell, _cycle, _run_into
from bench.predictor import ROOT, _free_port, _percentile
from bench.procs import stop_process

ROUND = 10  # requests per alternated round


@dataclass
class FloorRow:
    what: str  # e.g. "semantic hit, c=1"
    protocol: str
    ours: list[float]
    peer: list[float]
    peer_name: str

    @property
    def ours_p50(self) -> float:
        return _percentile(self.ours, 0.5)

    @property
    def peer_p50(self) -> float:
        return _percentile(self.peer, 0.5)


class _Child:
    """A bench helper process that prints `ready` on stdout when it can be used."""

    def __init__(self, args: list[str], stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError(f"{args[0]} did not start (said {line!r})")

    def ask(self, n: int) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return [float(x) for x in json.loads(self.proc.stdout.readline())]

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        stop_process(self.proc)  # type: ignore[arg-type]


async def _exact_bodies(clients: Clients, target: Target, prompt: str) -> tuple[bytes, bytes]:
    """The transformer's exact-hit answers as bytes on the wire: REST JSON body, gRPC message."""
    body = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [prompt]}],
        "parameters": {"max_tokens": clients.max_tokens, "temperature": 0},
    }
    r = await clients.http.post(f"{target.http}/v2/models/{MODEL}/infer", json=body)
    r.raise_for_status()
    pb = clients.pb
    req = pb.ModelInferRequest(
        model_name=MODEL,
        inputs=[pb.ModelInferRequest.InferInputTensor(
            name="text_input", datatype="BYTES", shape=[1],
            contents=pb.InferTensorContents(bytes_contents=[prompt.encode()]),
        )],
        parameters={"max_tokens": pb.InferParameter(int64_param=clients.max_tokens),
                    "temperature": pb.InferParameter(int64_param=0)},
    )
    resp = await clients._stub(target.grpc).ModelInfer(req, timeout=30)
    return r.content, resp.SerializeToString()


async def _alternate_peer(clients: Clients, target: Target, path: str, protocol: str,
                          prompts: Sequence[str], n: int, peer_round: object,
                          rng: random.Random) -> tuple[Cell, list[float]]:  # fmt: skip
    ours = Cell(path, protocol, 1)
    peer: list[float] = []
    done = 0
    while done < n:
        k = min(ROUND, n - done)
        await _run_into(ours, clients, target, _cycle(prompts, k, rng))
        peer += await peer_round(k)  # type: ignore[operator]
        done += k
    return ours, peer


async def floors(clients: Clients, transformer: Target, exact_prompts: Sequence[str],
                 semantic_prompts: Sequence[str], n: int, rng: random.Random) -> list[FloorRow]:  # fmt: skip
    rows: list[FloorRow] = []
    work = Path(tempfile.mkdtemp(prefix="bench-floors-"))
    (work / "prompts.txt").write_text("\n".join(p.replace("\n", " ") for p in semantic_prompts) + "\n")
    print(f"==> floors (issue 26): bare embedder forward in its own process, {n} rounds each", flush=True)
    embed = _Child(["bench.embed_peer", "--prompts", str(work / "prompts.txt")], stdin=True)
    try:
        for protocol in PROTOCOLS:
            ours, peer = await _alternate_peer(
                clients, transformer, "semantic", protocol, semantic_prompts, n,
                lambda k: asyncio.to_thread(embed.ask, k), rng,
            )
            rows.append(FloorRow("semantic hit, c=1", protocol, ours.latencies_ms, peer,
                                 "bare embedder forward (own process)"))
            _row(rows[-1])
            # c=32 right after its c=1 cell; the peer column holds the c=1 figures for the ratio.
            wide = Cell("semantic", protocol, 32)
            await _run_into(wide, clients, transformer, _cycle(semantic_prompts, max(n, 4 * 32), rng))
            rows.append(FloorRow("semantic hit, c=32 vs c=1", protocol, wide.latencies_ms,
                                 ours.latencies_ms, "our semantic hit at c=1"))
            _row(rows[-1])
    finally:
        embed.stop()

    rest_body, grpc_body = await _exact_bodies(clients, transformer, exact_prompts[0])
    (work / "rest.json").write_bytes(rest_body)
    (work / "grpc.bin").write_bytes(grpc_body)
    http_port, grpc_port = _free_port(), _free_port()
    print(f"==> floors: bare ASGI on uvicorn + bare grpc.aio, bodies {len(rest_body)} B (REST) and "
          f"{len(grpc_body)} B (gRPC message)", flush=True)
    bare = _Child(["bench.bare_peers", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                   "--rest-body", str(work / "rest.json"), "--grpc-body", str(work / "grpc.bin")])
    bare_target = Target("bare", f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
    try:
        for protocol in PROTOCOLS:
            async def bare_round(k: int, protocol: str = protocol) -> list[float]:
                cell = Cell("exact", protocol, 1)  # the stored body says `exact`
                await _run_into(cell, clients, bare_target, ["-"] * k)
                if cell.errors or cell.unexpected:
                    raise RuntimeError(f"bare peer ({protocol}): {cell.errors} errors, {dict(cell.statuses)}")
                return cell.latencies_ms

            await _run_into(Cell("exact", protocol, 1), clients, bare_target, ["-"] * ROUND)  # connect
            ours, peer = await _alternate_peer(clients, transformer, "exact", protocol, exact_prompts, n,
                                               bare_round, rng)
            name = "bare ASGI app on uvicorn" if protocol == "rest" else "bare grpc.aio server"
            rows.append(FloorRow("exact hit, c=1", protocol, ours.latencies_ms, peer, name))
            _row(rows[-1])
    finally:
        bare.stop()
    return rows


def _row(r: FloorRow) -> None:
    print(f"  {r.what:<26} {r.protocol:<4} ours p50 {r.ours_p50:7.2f} ms (n={len(r.ours)})  "
          f"{r.peer_name} p50 {r.peer_p50:7.2f} ms (n={len(r.peer)})  "
          f"diff {r.ours_p50 - r.peer_p50:+.2f} ms  ratio {r.ours_p50 / r.peer_p50:.2f}x", flush=True)


def floors_table(rows: Sequence[FloorRow]) -> str:
    lines = [
        "| path | protocol | ours p50 / p99 ms | peer | peer p50 / p99 ms | ours - peer p50 | ratio "
        "| n ours / peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.what} | {'v2 REST' if r.protocol == 'rest' else 'v2 gRPC'} | {r.ours_p50:.2f} / "
            f"{_percentile(r.ours, 0.99):.2f} | {r.peer_name} | {r.peer_p50:.2f} / "
            f"{_percentile(r.peer, 0.99):.2f} | {r.ours_p50 - r.peer_p50:+.2f} ms | "
            f"{r.ours_p50 / r.peer_p50:.2f}x | {len(r.ours)} / {len(r.peer)} |"
        )
    return "\n".join(lines)
