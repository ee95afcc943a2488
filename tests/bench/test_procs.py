"""bench/procs.py: the CPU split the benches use to run the engines apart from the transformer (the
deployed shape on one machine), checked on real child processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.predictor import Server, _free_port
from bench.procs import CoreSplit, Proc, parse_cpus


@pytest.mark.parametrize(
    ("spec", "cpus"),
    [("0", {0}), ("0,2", {0, 2}), ("1-3", {1, 2, 3}), ("0, 4-5", {0, 4, 5})],
)
def test_parse_cpus_takes_tasksets_syntax(spec: str, cpus: set[int]) -> None:
    assert parse_cpus(spec) == cpus


@pytest.mark.parametrize("spec", ["", "a", "1-x", "-1", "0,,1"])
def test_parse_cpus_names_a_bad_list(spec: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpus(spec)


def test_split_leaves_the_rest_to_the_transformer_and_clients() -> None:
    split = CoreSplit.of("0", frozenset({0, 1, 2, 3}))
    assert (split.engine, split.rest) == ({0}, {1, 2, 3})
    assert split.describe() == "engines on CPUs 0, transformer, Redis and clients on 1,2,3"


@pytest.mark.parametrize(
    ("spec", "message"),
    [("0-1", "leave none"), ("7", "not all among")],
)
def test_split_refuses_what_cannot_run(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CoreSplit.of(spec, frozenset({0, 1}))


def _cpus_of(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines()
                if line.startswith("Cpus_allowed_list"))  # fmt: skip


def test_a_pinned_child_runs_on_its_cpus_and_an_unpinned_one_where_its_parent_does(tmp_path: Path) -> None:
    first = min(os.sched_getaffinity(0))
    port, other = _free_port(), _free_port()
    pinned = Proc("pinned", [str(port), "--bind", "127.0.0.1"], f"http://127.0.0.1:{port}/",
                  tmp_path / "pinned.log", module="http.server", cpus=frozenset({first}))  # fmt: skip
    free = Proc("free", [str(other), "--bind", "127.0.0.1"], f"http://127.0.0.1:{other}/",
                tmp_path / "free.log", module="http.server")  # fmt: skip
    try:
        pinned.start().wait_ready(30)
        free.start().wait_ready(30)
        assert pinned.proc is not None and free.proc is not None
        assert _cpus_of(pinned.proc.pid) == str(first)
        assert _cpus_of(free.proc.pid) == _cpus_of(os.getpid())
    finally:
        pinned.stop()
        free.stop()


def test_a_pinned_server_runs_on_its_cpus(tmp_path: Path) -> None:
    first = min(os.sched_getaffinity(0))
    port = _free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with Server("peer", cmd, f"http://127.0.0.1:{port}", "/", tmp_path / "peer.log",
                cpus=frozenset({first})) as server:  # fmt: skip
        assert server.proc is not None
        assert _cpus_of(server.proc.pid) == str(first)


def test_a_bad_engine_cpus_flag_ends_the_bench_with_its_message() -> None:
    assert CoreSplit.from_flag(None) is None
    with pytest.raises(SystemExit, match="--engine-cpus: CPU list 'x'"):
        CoreSplit.from_flag("x")
