"""`semserve bench scale` end to end at a tiny size: real Redis, a real transformer, the real
lookup code. Functional only: the output has its fields; nothing is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_synthetic_entry_ids_are_the_real_exact_keys() -> None:
    from bench.scale_entries import exact_id, request_fingerprint, server_request
    from cache import keys
    from cache.schema import IndexSchema

    req = server_request("  Synthetic prompt number 7 ", "tenant-3")
    assert exact_id("tenant-3", request_fingerprint(IndexSchema("bench_scale")),
                    req.prompt) == keys.exact_key(req)


def test_synthetic_entries_carry_the_real_scope_tag() -> None:
    from bench.scale_entries import request_fingerprint, server_request
    from cache import keys
    from cache.schema import IndexSchema

    req = server_request("synthetic prompt number 7", "tenant-3")
    fp = request_fingerprint(IndexSchema("bench_scale"))
    assert keys.scope_tag_from_fingerprint("tenant-3", fp) == keys.scope_tag(req)


def test_bench_scale_end_to_end(tmp_path: Path) -> None:
    out, png = tmp_path / "RESULTS.md", tmp_path / "scale.png"
    r = subprocess.run(
        [sys.executable, "-m", "semserve", "bench", "scale", "--entries", "300,500", "--tenants", "10",
         "--queries", "30", "--algorithm", "HNSW", "--ef-runtime", "20", "--server-requests", "10",
         "--output", str(out), "--plot", str(png)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = out.read_text()
    assert "## Cache at scale" in text and "semserve bench scale --entries 300,500 --tenants 10" in text
    rows = [line for line in text.splitlines() if line.startswith("| 300 ") or line.startswith("| 500 ")]
    assert len(rows) == 4, text  # main table + EF_RUNTIME table, one row per size each
    main = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert len(main) == 12 and main[1] == "10" and main[9] == "1.000"  # recall@1 at 30 entries/tenant
    assert all(c != "-" for c in main), main  # server figures measured too
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
