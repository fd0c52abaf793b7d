"""``spectest compare DIR_A DIR_B``: what changed between two sweeps, with the plots overlaid.

Typical use: the same sweep before and after a new draft model, a new K, or a server upgrade.
For every workload both sweeps measured it tabulates A → B: speedup at concurrency 1,
acceptance and mean accepted length, both crossovers, and per arm the SLO break point, the
saturation knee and the best goodput; then per common concurrency the change in speculative
TPOT p50 and throughput. The figures are the report's, with both sweeps on the same axes
(A solid, B dashed). Output: ``compare.md``, a self-contained ``compare.html`` and ``plots/``.

It reads two sweep folders and writes files; numbers come from ``breakpoints``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from spectest.report import breakpoints as bpm
from spectest.report import plots
from spectest.report.render import (
    Bullets,
    Image,
    Section,
    Table,
    _x,
    atomic_write,
    fmt,
    to_html,
    to_markdown,
)
from spectest.report.table import Sweep, load_sweep


@dataclass(frozen=True)
class Compared:
    html: Path
    markdown: Path
    lines: list[str]


def _labels(a: Sweep, b: Sweep) -> tuple[Sweep, Sweep]:
    la, lb = a.label, b.label
    if la == lb:
        la, lb = f"A ({la})", f"B ({lb})"
    return replace(a, info={**a.info, "label": la}), replace(b, info={**b.info, "label": lb})


def _arrow(va: str, vb: str) -> str:
    return va if va == vb else f"{va} → {vb}"


def _change(a, b) -> str:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return "–"
    return fmt((fb / fa - 1) if fa else None, "+.0%")


def changes(a: Sweep, b: Sweep) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """(summary rows, per-step rows, one-line summaries) for the workloads both measured."""
    fa = bpm.find_all(a.table, a.slo, a.workloads)
    fb = bpm.find_all(b.table, b.slo, b.workloads)
    ia = {(x.workload, x.kind, x.arm): x for x in fa}
    ib = {(x.workload, x.kind, x.arm): x for x in fb}
    common = [w for w in a.workloads if w in b.workloads]
    summary, steps, lines = [], [], []
    for w in common:
        sa, sb = bpm.speedup_at(a.table, w), bpm.speedup_at(b.table, w)
        summary += [
            [w, "TPOT speedup at c=1", _x(sa.tpot), _x(sb.tpot), _change(sa.tpot, sb.tpot)],
            [w, "throughput ratio at c=1", _x(sa.throughput), _x(sb.throughput),
             _change(sa.throughput, sb.throughput)],
            [w, "acceptance rate", fmt(sa.acceptance_rate, ".2f"), fmt(sb.acceptance_rate, ".2f"),
             _change(sa.acceptance_rate, sb.acceptance_rate)],
            [w, "mean accepted length", fmt(sa.mean_accepted_length, ".2f"),
             fmt(sb.mean_accepted_length, ".2f"),
             _change(sa.mean_accepted_length, sb.mean_accepted_length)]]
        for kind, name in (("crossover_tpot", "crossover (TPOT)"),
                           ("crossover_throughput", "crossover (throughput)")):
            x, y = ia[(w, kind, None)], ib[(w, kind, None)]
            summary.append([w, name, x.headline(), y.headline(),
                            _change(x.concurrency, y.concurrency)])
        for arm in ("spec", "base"):
            if (w, "slo", arm) not in ia or (w, "slo", arm) not in ib:
                continue
            for kind, name in (("slo", "SLO break point"), ("knee", "saturation knee")):
                x, y = ia[(w, kind, arm)], ib[(w, kind, arm)]
                summary.append([w, f"{name} · {plots.ARM_LABELS[arm]}", x.headline(),
                                y.headline(), _change(x.concurrency, y.concurrency)])
            x, y = ia[(w, "max_goodput", arm)], ib[(w, "max_goodput", arm)]
            summary.append([w, f"max goodput · {plots.ARM_LABELS[arm]}",
                            f"{fmt(x.metric, '.3g')} req/s", f"{fmt(y.metric, '.3g')} req/s",
                            _change(x.metric, y.metric)])
        sa_s, sb_s = a.series(w, "spec").set_index("concurrency"), \
            b.series(w, "spec").set_index("concurrency")
        for c in sorted(set(sa_s.index) & set(sb_s.index)):
            ra, rb = sa_s.loc[c], sb_s.loc[c]
            steps.append([w, fmt(c, "g"), fmt(ra.tpot_p50_ms, ".1f"), fmt(rb.tpot_p50_ms, ".1f"),
                          _change(ra.tpot_p50_ms, rb.tpot_p50_ms),
                          fmt(ra.output_tokens_per_s, ".0f"), fmt(rb.output_tokens_per_s, ".0f"),
                          _change(ra.output_tokens_per_s, rb.output_tokens_per_s),
                          fmt(ra.acceptance_rate, ".2f"), fmt(rb.acceptance_rate, ".2f")])
        ct_a, ct_b = ia[(w, "crossover_tpot", None)], ib[(w, "crossover_tpot", None)]
        lines.append(f"{w}: TPOT speedup at c=1 {_arrow(_x(sa.tpot), _x(sb.tpot))}; acceptance "
                     f"{_arrow(fmt(sa.acceptance_rate, '.2f'), fmt(sb.acceptance_rate, '.2f'))};"
                     f" crossover (TPOT) {_arrow(ct_a.headline(), ct_b.headline())}")
    only = sorted(set(a.workloads) ^ set(b.workloads))
    if only:
        lines.append(f"measured in only one sweep (not compared): {', '.join(only)}")
    return summary, steps, lines


def compare(dir_a: str | Path, dir_b: str | Path, out: str | Path) -> Compared:
    a, b = _labels(load_sweep(dir_a), load_sweep(dir_b))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fa = bpm.find_all(a.table, a.slo, a.workloads)
    fb = bpm.find_all(b.table, b.slo, b.workloads)
    figures = plots.plot_all([a, b], [fa, fb], out / "plots")
    summary, steps, lines = changes(a, b)
    title = f"spectest compare — {a.label} vs {b.label}"
    sections = [
        Section("What changed", [Bullets(lines) if lines else "No workload in common.",
                                 f"A = {a.folder} ({a.info.get('status', '?')}), "
                                 f"B = {b.folder} ({b.info.get('status', '?')}). SLOs: A "
                                 f"{a.slo.describe()}; B {b.slo.describe()}."]),
        Section("Break points and speedup, A → B",
                [Table(["workload", "figure", a.label, b.label, "change"], summary)]),
        Section("Speculative arm per concurrency, A → B", [Table(
            ["workload", "c", f"TPOT p50 {a.label}", f"TPOT p50 {b.label}", "change",
             f"tok/s {a.label}", f"tok/s {b.label}", "change", f"acceptance {a.label}",
             f"acceptance {b.label}"], steps)]),
        Section("Figures (A solid, B dashed)",
                [Image(p, "K advisor of B" if name == "k_advisor" else name.replace("_", " "))
                 for name, p in figures.items()]),
    ]
    md, page = out / "compare.md", out / "compare.html"
    atomic_write(md, to_markdown(title, sections, out))
    atomic_write(page, to_html(title, sections))
    return Compared(page, md, lines)
