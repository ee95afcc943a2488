"""`semserve bench stream`'s transformer CPU per streamed token: read from the real process, and
reported per transformer cell (what one transformer core can relay)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.stream import Cell, Sample, latency_table, process_cpu_s

BUSY_THEN_IDLE = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)"
)


def test_process_cpu_s_counts_what_a_real_child_burned() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY_THEN_IDLE])
    try:
        start = process_cpu_s(child.pid)
        time.sleep(1.5)  # its 0.4 s busy loop is over by then (it sleeps after it)
        burned = process_cpu_s(child.pid) - start
        assert 0.3 <= burned <= 1.0, burned
        time.sleep(0.5)
        assert process_cpu_s(child.pid) - start - burned < 0.05  # asleep: nothing more
    finally:
        child.kill()
        child.wait()


def test_cpu_per_token_in_the_transformer_rows_only() -> None:
    ours = Cell("transformer", 8, samples=[Sample(120.0, 20.0, 64, 64), Sample(130.0, 21.0, 64, 60)],
                cpu_ms=102.4)
    direct = Cell("direct", 8, samples=[Sample(100.0, 20.0, 64, 64)])
    assert abs(ours.cpu_ms_per_token - 0.8) < 1e-9  # 102.4 ms over 128 tokens
    assert direct.cpu_ms_per_token != direct.cpu_ms_per_token  # nan: not measured
    rows = latency_table([ours, direct]).splitlines()
    assert "transformer CPU ms/token" in rows[0]
    assert rows[2].startswith("| transformer | 8 | 2 |") and "| 0.800 |" in rows[2]
    # Lookup, CPU and statuses: none for a direct cell.
    assert rows[3].startswith("| direct | 8 | 1 |") and rows[3].endswith("| 1.00 | - | - | - |")
