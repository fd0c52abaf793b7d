"""``cost.png``: cost per 1M output tokens vs concurrency, one panel per workload, per arm.

Error bars are the 95 % intervals of each step's cost (from its goodput interval); a step that
misses an SLO is marked ×, one with too few requests ○ (neither is an operating point), and
the cheapest operating point of each arm ★. With two sweeps (``compare``) line style tells
them apart, as in ``plots``. It draws what ``cost.analyse`` decided; it decides nothing.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import FuncFormatter

from spectest.report import cost as costm
from spectest.report.plots import (
    ARM_COLOURS,
    ARM_LABELS,
    STYLES,
    _concurrency_axis,
    _legend,
    _panels,
    _save,
)
from spectest.report.table import Sweep


def cost_figure(sweeps: list[Sweep], analyses: list[list[costm.WorkloadCost]],
                inputs: list[costm.CostInputs], path: Path) -> Path | None:
    """None when no step of any sweep has a cost to draw."""
    if not any(p.cost for an in analyses for wc in an for pl in wc.plans.values()
               for p in pl.points):
        return None
    priced = all(i.priced for i in inputs)
    unit = "per 1M output tokens" if priced else "replica-hours per 1M output tokens"
    fig, axes, workloads = _panels(sweeps, f"Cost ({unit}) vs concurrency (lower is better)")
    plain = FuncFormatter(lambda y, _: f"{y:.3g}")
    for ax, w in zip(axes, workloads, strict=False):
        for si, (s, an) in enumerate(zip(sweeps, analyses, strict=True)):
            wc = next((x for x in an if x.workload == w), None)
            if wc is None:
                continue
            for arm, pl in wc.plans.items():
                pts = [p for p in pl.points if p.cost]
                if not pts:
                    continue
                colour = ARM_COLOURS.get(arm, "k")
                name = ARM_LABELS.get(arm, arm)
                label = f"{s.label}: {name}" if len(sweeps) > 1 else name
                xs = [p.concurrency for p in pts]
                ys = [p.cost for p in pts]
                lo = [p.cost - p.cost_interval[0] if p.cost_interval else 0 for p in pts]
                hi = [p.cost_interval[1] - p.cost if p.cost_interval else 0 for p in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], color=colour, ls=STYLES[si % 3], lw=1.8,
                            marker="o", ms=5, capsize=3, label=label)
                for p in pts:
                    if p.misses:
                        ax.plot([p.concurrency], [p.cost], marker="x", ms=11, mew=2.2,
                                color="#d73027", ls="none", zorder=6,
                                label="misses an SLO" if si == 0 else None)
                    elif p.thin:
                        ax.plot([p.concurrency], [p.cost], marker="o", ms=11, mfc="none",
                                mec="#777777", mew=1.5, ls="none", zorder=6,
                                label="too few requests" if si == 0 else None)
                if pl.cheapest is not None:
                    ax.plot([pl.cheapest.concurrency], [pl.cheapest.cost], marker="*", ms=15,
                            color=colour, mec="black", ls="none", zorder=7,
                            label="cheapest operating point" if si == 0 else None)
        ax.set_title(w, fontsize=10)
        ax.set_ylabel(unit, fontsize=9)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        _concurrency_axis(ax, sweeps)
    _legend(fig, axes)
    return _save(fig, path)
