"""Markdown tables of `semserve bench cache`, with its latency goals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.cache_e2e import Cell
from bench.cache_peer import PeerLatency
from bench.predictor import _percentile

# Issue 14's bars (an older issue had exact 2 ms and miss overhead 10 ms).
GOAL_EXACT_P50_MS = 1.5
GOAL_SEMANTIC_P50_MS = 5.0
GOAL_SEMANTIC_P99_MS = 15.0
GOAL_MISS_OVERHEAD_P50_MS = 5.0

def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def e2e_table(cells: Sequence[Cell]) -> tuple[str, list[str]]:
    rows = [
        "| path | protocol | concurrency | n | req/s | p50 ms | p99 ms | server mean ms | lookup mean ms "
        "| goal | met | other statuses / errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    missed: list[str] = []
    for c in cells:
        goal, met = "-", "-"
        if c.path == "exact":
            goal = f"p50 <= {GOAL_EXACT_P50_MS:g}"
            ok = c.p50 <= GOAL_EXACT_P50_MS
            met = "PASS" if ok else "not yet"
            if not ok:
                missed.append(f"exact hit {c.protocol} c={c.concurrency}: p50 {c.p50:.2f} ms "
                              f"(goal {GOAL_EXACT_P50_MS:g})")
        elif c.path == "semantic":
            goal = f"p50 <= {GOAL_SEMANTIC_P50_MS:g}, p99 <= {GOAL_SEMANTIC_P99_MS:g}"
            ok50, ok99 = c.p50 <= GOAL_SEMANTIC_P50_MS, c.p99 <= GOAL_SEMANTIC_P99_MS
            failed = [name for name, ok in (("p50", ok50), ("p99", ok99)) if not ok]
            met = f"not yet ({', '.join(failed)})" if failed else "PASS"
            if not (ok50 and ok99):
                missed.append(f"semantic hit {c.protocol} c={c.concurrency}: p50 {c.p50:.2f} ms, "
                              f"p99 {c.p99:.2f} ms (goals {GOAL_SEMANTIC_P50_MS:g} / "
                              f"{GOAL_SEMANTIC_P99_MS:g})")
        other = {s: n for s, n in c.statuses.items() if s != c.expected}
        note = ", ".join(f"{s} {n}" for s, n in sorted(other.items()))
        if c.errors:
            note = (note + ", " if note else "") + f"errors {c.errors}"
        rows.append(
            f"| {c.path} | {c.protocol} | {c.concurrency} | {len(c.latencies_ms)} | {_fmt(c.per_s, 0)} | "
            f"{_fmt(c.p50)} | "
            f"{_fmt(c.p99)} | {_fmt(c.server_ms)} | {_fmt(c.lookup_ms)} | {goal} | {met} | {note or '-'} |"
        )
    return "\n".join(rows), missed


def overhead_table(cells: Sequence[Cell]) -> tuple[str, list[str]]:
    rows = [
        "| protocol | concurrency | miss p50 ms | direct p50 ms | overhead p50 ms | miss p99 ms "
        "| direct p99 ms | goal | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    missed: list[str] = []
    by = {(c.path, c.protocol, c.concurrency): c for c in cells}
    for (path, protocol, conc), miss in by.items():
        if path != "miss":
            continue
        direct = by[("direct", protocol, conc)]
        over = miss.p50 - direct.p50
        ok = over <= GOAL_MISS_OVERHEAD_P50_MS
        if not ok:
            missed.append(f"miss overhead {protocol} c={conc}: {over:.1f} ms p50 "
                          f"({miss.p50:.1f} - {direct.p50:.1f}; goal {GOAL_MISS_OVERHEAD_P50_MS:g})")
        rows.append(
            f"| {protocol} | {conc} | {_fmt(miss.p50, 1)} | {_fmt(direct.p50, 1)} | {_fmt(over, 1)} | "
            f"{_fmt(miss.p99, 1)} | {_fmt(direct.p99, 1)} | <= {GOAL_MISS_OVERHEAD_P50_MS:g} | "
            f"{'PASS' if ok else 'not yet'} |"
        )
    return "\n".join(rows), missed


def peer_latency_table(results: Sequence[PeerLatency], version: str) -> str:
    rows = [
        f"| lookup (in process, sequential) | ours p50 / p99 ms | RedisVL {version} p50 / p99 ms | "
        "p50 ratio ours/RedisVL | hits ours / RedisVL |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        o50, o99 = _percentile(r.ours_ms, 0.5), _percentile(r.ours_ms, 0.99)
        t50, t99 = _percentile(r.theirs_ms, 0.5), _percentile(r.theirs_ms, 0.99)
        rows.append(
            f"| {r.kind} | {o50:.2f} / {o99:.2f} | {t50:.2f} / {t99:.2f} | {o50 / t50:.2f} | "
            f"{r.ours_hits}/{len(r.ours_ms)} / {r.theirs_hits}/{len(r.theirs_ms)} |"
        )
    parts = [
        f"{r.kind}: " + ", ".join(f"{k} {_percentile(v, 0.5):.2f}" for k, v in r.ours_parts.items())
        for r in results[:2] if r.ours_parts
    ]
    if parts:
        rows.append("\nOurs, p50 per lookup phase (ms; `exact` is the exact-key GET, `search` the KNN): "
                    + "; ".join(parts) + ".")
    return "\n".join(rows)


def eval_table(reports: Sequence[Any]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    rows = [
        "| method | served_same (higher better) | wrong_served (lower better) | precision | n same/diff |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in reports:
        o = r.overall
        rows.append(f"| {name} | {pct(o.served_same_rate)} | {pct(o.wrong_served_rate)} | "
                    f"{pct(o.precision)} | {o.n_same}/{o.n_diff} |")
    return "\n".join(rows)
