"""The issue 26 bench capabilities on a tiny sample, with real servers: `semserve bench cache`'s
floors (bare embedder forward in its own process, 32 concurrent semantic hits, bare ASGI and bare
grpc.aio peers), `semserve bench miss` (alternated misses vs direct, v2 and OpenAI) and the py-spy
profile of semantic hits. Each runs against the session's predictor (SEMSERVE_TEST_PREDICTOR or
the one tests/conftest.py starts) and starts its own Redis and transformer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from bench.profile_hit import aggregate, part_of
from tests.conftest import Predictor
from tests.support import ROOT

# A few same-answer eval pairs are enough for the hit paths.
EVAL = ROOT / "cache" / "data" / "eval_pairs.jsonl"


def _pairs(tmp_path: Path, n: int = 80) -> Path:
    out = tmp_path / "pairs.jsonl"
    out.write_text("".join(EVAL.read_text().splitlines(keepends=True)[:n]))
    return out


def _semserve(*args: str, timeout: int = 900) -> str:
    r = subprocess.run([sys.executable, "-m", "semserve", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def _ms(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


def test_bench_cache_prints_the_floor_rows(predictor: Predictor, tmp_path: Path) -> None:
    out = _semserve(
        "bench", "cache", "--predictor", f"{predictor.http},{predictor.grpc}", "--pairs",
        str(_pairs(tmp_path)), "--max-pairs", "8", "--concurrency", "1", "--requests-hit", "4",
        "--requests-miss", "1", "--warmup", "2", "--skip-redisvl", "--floor-requests", "10",
        "--output", str(tmp_path / "results.md"),
        # The rows, not their speed, are under test: a KNN past the 50 ms default on this busy
        # machine turns a hit into a miss, and three in a row take Redis out of the path for 1 s,
        # which once left the c=32 row with no semantic hit at all.
        "--transformer-arg=--cache-lookup-timeout-ms=2000",
    )
    for row in ("| semantic hit, c=1 | v2 REST |", "| semantic hit, c=1 | v2 gRPC |",
                "| semantic hit, c=32 vs c=1 | v2 REST |", "| semantic hit, c=32 vs c=1 | v2 gRPC |",
                "| exact hit, c=1 | v2 REST |", "| exact hit, c=1 | v2 gRPC |"):
        assert row in out, out[-3000:]
    assert "bare embedder forward (own process)" in out
    assert "| bare ASGI app on uvicorn |" in out and "| bare grpc.aio server |" in out
    # Every row has both sides measured: n ours / peer.
    counts = re.findall(r"\| (\d+) / (\d+) \|$", out, re.M)
    assert len(counts) == 6, out[-3000:]
    for ours, peer in counts:
        # 10 each; a paraphrase the verifier answers otherwise on this busy machine is left out.
        assert int(ours) >= 5 and int(peer) >= 5
    assert "The hit paths against their floors" in (tmp_path / "results.md").read_text()


def test_bench_miss_alternates_real_misses_with_direct(predictor: Predictor, tmp_path: Path) -> None:
    out = _semserve("bench", "miss", "--predictor", f"{predictor.http},{predictor.grpc}", "--samples", "3",
                    "--warmup", "1", "--output", str(tmp_path / "results.md"))
    rows = [line for line in out.splitlines() if line.startswith(("| v2 REST |", "| OpenAI chat"))]
    assert len(rows) == 2, out[-2000:]
    for row in rows:
        assert row.endswith("| 3 / 3 | 0 |"), row  # 3 real misses, 3 direct, nothing else
    assert "## Issue 26: miss overhead, not streamed" in (tmp_path / "results.md").read_text()


def test_profile_of_semantic_hits_writes_svg_and_table(predictor: Predictor, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench.profile_hit", "--predictor", f"{predictor.http},{predictor.grpc}",
         "--seconds", "2", "--rate", "100", "--name", "test", "--out-dir", str(tmp_path), "--pairs",
         str(_pairs(tmp_path)), "--max-pairs", "12", "--results", str(tmp_path / "results.md")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert (tmp_path / "profile-semantic-hit-test.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    table = (tmp_path / "results.md").read_text()
    assert "## Issue 26: profile of a semantic hit (test;" in table
    assert "| embed (tokenize, ONNX forward, pooling) |" in table, table
    assert _ms(r"\*\*all sampled\*\* \| \*\*([\d.]+)\*\*", table)[0] > 0


def test_profile_parts_from_folded_stacks() -> None:
    embed = "run (uvicorn/server.py:1);lookup (cache/semantic_cache.py:2);_forward (cache/embedder.py:3)"
    knn = "run (uvicorn/server.py:1);lookup (cache/semantic_cache.py:2);parse (cache/search_reply.py:9)"
    assert part_of(embed).startswith("embed (")
    assert part_of(knn).startswith("KNN")
    assert part_of("select (selectors.py:1)") == "other"
    parts = aggregate([f"{embed} 7\n", f"{knn} 3\n", "garbage\n"])
    assert parts[part_of(embed)] == 7 and parts[part_of(knn)] == 3 and sum(parts.values()) == 10
