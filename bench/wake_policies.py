"""`python -m bench.wake_policies`: scale to zero, scale to sleep and min-scale 1 compared for a sporadic
dev tenant and a bursty prod tenant, on the measured CPU profile and the published GPU profile
(serverless/wake_policy.py says how and where each figure comes from). Prints a markdown table and
saves a PNG.

    python -m bench.wake_policies --duration 14400 --seed 0 --png bench/wake-policies.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serverless import wake_policy as wp


def run_all(duration: float, seed: int, sleep_after_idle_s: float) -> list[wp.PolicyResult]:
    results: list[wp.PolicyResult] = []
    for hardware in (wp.cpu_measured(), wp.gpu_published()):
        for tenant in (wp.dev_tenant(duration, seed), wp.prod_tenant(duration, seed)):
            results += wp.compare(hardware, tenant, duration, seed, sleep_after_idle_s)
    return results


def plot(results: list[wp.PolicyResult], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tenants = list(dict.fromkeys(r.tenant for r in results))
    fig, axes = plt.subplots(len(tenants), 2, figsize=(13, 4.2 * len(tenants)), squeeze=False)
    for row, tenant in enumerate(tenants):
        shown = [r for r in results if r.tenant == tenant and not r.note]
        labels = [f"{r.hardware.split()[0]}\n{r.policy}" for r in shown]
        xs = range(len(shown))
        ax = axes[row][0]
        ax.bar([x - 0.2 for x in xs], [r.miss_p50 or 0 for r in shown], 0.4, label="miss p50")
        ax.bar([x + 0.2 for x in xs], [r.miss_p99 or 0 for r in shown], 0.4, label="miss p99")
        ax.scatter(list(xs), [r.hit_p99 or 0 for r in shown], c="tab:green", zorder=3, label="hit p99")
        ax.set_yscale("log")
        ax.set_ylabel("first-answer wait (s)")
        ax.set_title(f"{tenant}: first-answer wait")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.legend(fontsize=8)
        ax = axes[row][1]
        ax.bar([x - 0.2 for x in xs], [r.seconds_allocated or 0 for r in shown], 0.4, label="allocated")
        awake = [r.seconds_awake or 0 for r in shown]
        ax.bar([x + 0.2 for x in xs], awake, 0.4, label="awake (in GPU memory)")
        ax.set_ylabel("accelerator-seconds (CPU: pod-seconds)")
        ax.set_title(f"{tenant}: cost")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wake_policies", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=14400.0, help="seconds of traffic per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sleep-after-idle-s", type=float, default=60.0,
                   help="the scale-to-sleep policy's idle window")  # fmt: skip
    p.add_argument("--png", type=Path, default=None, help="save the figure here")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.sleep_after_idle_s <= 0:
        print("--duration and --sleep-after-idle-s must be > 0", file=sys.stderr)
        return 2
    results = run_all(args.duration, args.seed, args.sleep_after_idle_s)
    print(f"{args.duration:g} s of traffic per run, seed {args.seed}, "
          f"sleep after {args.sleep_after_idle_s:g} s idle")  # fmt: skip
    for hardware in (wp.cpu_measured(), wp.gpu_published()):
        print(f"- {hardware.name}: {hardware.source}")
    for tenant in (wp.dev_tenant(args.duration, args.seed), wp.prod_tenant(args.duration, args.seed)):
        print(f"- {tenant.name} (overlay {tenant.overlay}): {tenant.description}")
    print()
    print(wp.markdown_table(results))
    if args.png is not None:
        plot(results, args.png, f"wake policies, {args.duration:g} s, seed {args.seed}, "
             f"sleep after {args.sleep_after_idle_s:g} s")  # fmt: skip
        print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
