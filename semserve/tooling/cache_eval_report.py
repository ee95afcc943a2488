"""The eval harness's text tables: one row per method, per-category columns, the mistakes list.

Pure formatting of semserve.tooling.cache_eval's Reports, for `semserve cache eval` and bench/.
"""

from __future__ import annotations

from collections.abc import Sequence

from semserve.tooling.cache_eval import Figures, Report


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def format_reports(title: str, reports: Sequence[Report], per_category: Report | None = None) -> str:
    lines = [
        title,
        f"  {'method':<16} {'served_same':>11} {'wrong_served':>12} {'precision':>9}   n_same/n_diff",
    ]
    for r in reports:
        o = r.overall
        goal = "  goal met" if r.meets_goal else ""
        lines.append(
            f"  {r.name:<16} {_pct(o.served_same_rate):>11} {_pct(o.wrong_served_rate):>12} "
            f"{_pct(o.precision):>9}   {o.n_same}/{o.n_diff}{goal}"
        )
    if per_category is not None:
        lines.append(f"  per category ({per_category.name}):")
        lines.append(f"    {'category':<20} {'n':>4} {'served_same':>11} {'wrong_served':>12}")
        for cat, f in sorted(per_category.per_category.items()):
            lines.append(
                f"    {cat:<20} {f.n_same + f.n_diff:>4} {_pct(f.served_same_rate):>11} "
                f"{_pct(f.wrong_served_rate):>12}"
            )
    return "\n".join(lines)


def format_categories(reports: Sequence[Report]) -> str:
    """Per category, one column per method: served share of same-answer categories, wrong-served
    share of look-alike categories (a category of the older sets may hold both)."""
    cats = sorted({c for r in reports for c in r.per_category})
    head = f"    {'category':<20} {'n':>4}  " + " ".join(f"{r.name[:14]:>14}" for r in reports)
    lines = ["  per category (same-answer: served; look-alike: WRONG served):", head]
    for cat in cats:
        first = reports[0].per_category.get(cat, Figures())
        cells = []
        for r in reports:
            f = r.per_category.get(cat, Figures())
            parts = []
            if f.n_same:
                parts.append(_pct(f.served_same_rate).strip())
            if f.n_diff:
                parts.append("W" + _pct(f.wrong_served_rate).strip())
            cells.append(f"{'/'.join(parts):>14}")
        lines.append(f"    {cat:<20} {first.n_same + first.n_diff:>4}  " + " ".join(cells))
    return "\n".join(lines)


def format_mistakes(report: Report) -> str:
    """One line per pair the report decided wrong: a wrong serve or a missed repeat."""
    return "\n".join(
        f"    {'WRONG SERVE' if o.served else 'missed':<11} [{o.pair.category}] {o.rule} "
        f"{o.score:.3f}: {o.pair.a!r} / {o.pair.b!r} ({o.detail})"
        for o in report.mistakes()
    )
