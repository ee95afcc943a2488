"""Output of `semserve bench scale`: markdown tables, the PNG plot, and the command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from bench.scale_lookups import Latency, ScaleRow


def _f(x: float) -> str:
    return "-" if x != x else f"{x:.2f}"  # NaN: not measured


def table(rows: Sequence[ScaleRow]) -> str:
    head = ("| entries | tenants | index (HNSW M/EFC/EFR) | write s | index build s | B/entry (data) | "
            "B/entry (with index) | exact p50/p99 ms | KNN p50/p99 ms | KNN recall@1 | "
            "server exact p50/p99 ms | server semantic p50/p99 ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        knn = r.knn.get(0, Latency())
        lines.append(
            f"| {r.entries:,} | {r.tenants:,} | {r.hnsw} | {r.write_s:.1f} | {r.index_s:.1f} | "
            f"{r.data_bytes_per_entry:,.0f} | {r.total_bytes_per_entry:,.0f} | "
            f"{_f(r.exact.p50)} / {_f(r.exact.p99)} | {_f(knn.p50)} / {_f(knn.p99)} | "
            f"{r.recall.get(0, float('nan')):.3f} | {_f(r.server_exact.p50)} / {_f(r.server_exact.p99)} | "
            f"{_f(r.server_semantic.p50)} / {_f(r.server_semantic.p99)} |"
        )
    for r in rows:
        if r.server_failures:
            lines.append("")
            lines.append(f"{r.entries:,} entries: server answers that were not the expected hit "
                         f"(not timed): {', '.join(f'{k} x{v}' for k, v in r.server_failures.items())}")
    return "\n".join(lines)


def ef_table(rows: Sequence[ScaleRow]) -> str:
    lines = ["| entries | tenants | HNSW M/EFC | EF_RUNTIME | KNN p50 ms | KNN p99 ms | recall@1 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for ef, lat in sorted(r.knn.items()):
            if ef == 0:
                continue
            lines.append(f"| {r.entries:,} | {r.tenants:,} | {r.hnsw.rsplit('/', 1)[0]} | {ef} | "
                         f"{_f(lat.p50)} | {_f(lat.p99)} | {r.recall[ef]:.3f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def plot(rows: Sequence[ScaleRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.entries for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [
        ("exact lookup (in process)", [r.exact.p50 for r in rows]),
        ("KNN (in process)", [r.knn.get(0, Latency()).p50 for r in rows]),
        ("exact hit (server, v2 REST)", [r.server_exact.p50 for r in rows]),
        ("semantic hit (server, v2 REST)", [r.server_semantic.p50 for r in rows]),
    ]
    for label, ys in series:
        if any(y == y for y in ys):
            ax.plot(xs, ys, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("entries in the cache")
    ax.set_ylabel("p50 latency (ms)")
    ax.set_title(f"semserve lookup latency vs cache size ({rows[0].tenants if rows else 0} tenants max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command_line(args: argparse.Namespace) -> str:
    parts = [f"semserve bench scale --entries {args.entries} --tenants {args.tenants}",
             f"--queries {args.queries}"]
    if args.algorithm != "FLAT":
        parts.append(f"--algorithm {args.algorithm}")
    if args.hnsw_m:
        parts.append(f"--hnsw-m {args.hnsw_m}")
    if args.ef_construction:
        parts.append(f"--ef-construction {args.ef_construction}")
    if args.ef_runtime:
        parts.append(f"--ef-runtime {args.ef_runtime}")
    if args.ef_runtime_default:
        parts.append(f"--ef-runtime-default {args.ef_runtime_default}")
    parts.append("--skip-server" if args.skip_server else f"--server-requests {args.server_requests}")
    return " ".join(parts)
