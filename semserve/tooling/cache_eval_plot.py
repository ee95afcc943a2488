"""The precision vs hit-ratio curve of `semserve cache eval --plot` (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def curve(same: Sequence[bool], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, hit ratio, precision) with one point per distinct score, strictest last.

    Hit ratio: the share of same-answer pairs served; precision: served pairs that were right.
    """
    y = np.asarray(same, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    ts = np.unique(s[s > 0])
    hit = np.array([(s[y] >= t).mean() if y.any() else 0.0 for t in ts])
    prec = np.array([(y[s >= t]).mean() if (s >= t).any() else 1.0 for t in ts])
    return ts, hit, prec


def plot_curves(
    path: Path,
    title: str,
    same: Sequence[bool],
    scores: Sequence[float],
    cosines: Sequence[float],
    threshold: float,
    max_wrong_rate: float,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file, in CI too
    import matplotlib.pyplot as plt

    y = np.asarray(same, dtype=bool)
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    _, h, p = curve(same, scores)
    ax.plot(h, p, label="learned scorer (all thresholds)", color="tab:blue")
    _, hc, pc = curve(same, cosines)
    ax.plot(hc, pc, label="plain cosine (all thresholds)", color="tab:gray", linestyle="--")
    s = np.asarray(scores)
    served = s >= threshold
    if served.any():
        ax.scatter(
            [served[y].mean()],
            [y[served].mean()],
            color="tab:red",
            zorder=5,
            label=f"operating point: score >= {threshold:.3f} (budget {max_wrong_rate:.1%} wrong)",
        )
    c = np.asarray(cosines)
    for t, marker in ((0.90, "s"), (0.80, "^")):
        sv = c >= t
        if sv.any():
            name = "RedisVL default" if t == 0.90 else "GPTCache default"
            ax.scatter([sv[y].mean()], [y[sv].mean()], marker=marker, color="black", zorder=5,
                       label=f"{name}: cosine >= {t:.2f}")
    ax.set_xlabel("hit ratio (share of same-answer pairs served)")
    ax.set_ylabel("precision (served pairs that were right)")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(min(0.4, float(p.min()) if len(p) else 0.4), 1.01)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
