"""``spectest compare DIR_A DIR_B``: what changed between two sweeps, with the plots overlaid.

Typical use: the same sweep before and after a new draft model, a new K, or a server upgrade.
For every workload both sweeps measured it tabulates A → B: speedup at concurrency 1 (with the
requests behind it and its interval, or "not enough data"), acceptance and mean accepted
length, both crossovers, and per arm the SLO break point, the saturation knee and the best
goodput, each with what it rests on; the cheapest cost per 1M output tokens per arm and the
saving from speculation; then per common concurrency the change in speculative TPOT p50 and
throughput, and — where the servers report round timings — the speculative round's draft,
network and verify milliseconds (co-located vs disaggregated drafting, for example). The figures are the report's, with both sweeps on the same axes (A solid, B
dashed). Output: ``compare.md``, a self-contained ``compare.html`` and ``plots/``. A side
measured by another tool (AIPerf, GuideLLM: ``peers``) carries its setup and the notes of what
its files lack.

It reads two sweep folders and writes files; numbers come from ``sections.analyse``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from spectest.report import breakpoints as bpm
from spectest.report import evidence as ev
from spectest.report import plots
from spectest.report.cost import CostInputs, assumptions
from spectest.report.cost_section import compare_rows
from spectest.report.document import (
    Bullets,
    Image,
    Section,
    Table,
    atomic_write,
    fmt,
    to_html,
    to_markdown,
)
from spectest.report.plots_cost import cost_figure
from spectest.report.sections import Analysis, analyse, with_options
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


def _ratio_change(ra: ev.Ratio | None, rb: ev.Ratio | None) -> str:
    """The change only when both sides are stated (not "not enough data")."""
    if ra is None or rb is None or not (ra.resolved and rb.resolved):
        return "–"
    return _change(ra.value, rb.value)


def _text(r: ev.Ratio | None) -> str:
    return r.text() if r is not None else "no data"


def changes(a: Analysis, b: Analysis) -> tuple[list[list[str]], list[list[str]], list[str]]:
    """(summary rows, per-step rows, one-line summaries) for the workloads both measured."""
    ia = {(x.workload, x.kind, x.arm): x for x in a.found}
    ib = {(x.workload, x.kind, x.arm): x for x in b.found}
    ta, tb = a.sweep.table, b.sweep.table
    common = [w for w in a.sweep.workloads if w in b.sweep.workloads]
    summary, steps, lines = [], [], []
    for w in common:
        sa = bpm.speedup_at(ta, w, min_requests=a.min_requests)
        sb = bpm.speedup_at(tb, w, min_requests=b.min_requests)
        summary += [
            [w, "TPOT speedup at c=1", _text(sa.tpot_ratio), _text(sb.tpot_ratio),
             _ratio_change(sa.tpot_ratio, sb.tpot_ratio)],
            [w, "throughput ratio at c=1", _text(sa.throughput_ratio),
             _text(sb.throughput_ratio),
             _ratio_change(sa.throughput_ratio, sb.throughput_ratio)],
            [w, "acceptance rate", fmt(sa.acceptance_rate, ".2f"), fmt(sb.acceptance_rate, ".2f"),
             _change(sa.acceptance_rate, sb.acceptance_rate)],
            [w, "mean accepted length", fmt(sa.mean_accepted_length, ".2f"),
             fmt(sb.mean_accepted_length, ".2f"),
             _change(sa.mean_accepted_length, sb.mean_accepted_length)]]
        for kind, name in (("crossover_tpot", "crossover (TPOT)"),
                           ("crossover_throughput", "crossover (throughput)")):
            x, y = ia[(w, kind, None)], ib[(w, kind, None)]
            summary.append([w, name, x.summary(), y.summary(),
                            _change(x.concurrency, y.concurrency)])
        for arm in ("spec", "base"):
            if (w, "slo", arm) not in ia or (w, "slo", arm) not in ib:
                continue
            for kind, name in (("slo", "SLO break point"), ("knee", "saturation knee")):
                x, y = ia[(w, kind, arm)], ib[(w, kind, arm)]
                summary.append([w, f"{name} · {plots.ARM_LABELS[arm]}", x.summary(),
                                y.summary(), _change(x.concurrency, y.concurrency)])
            x, y = ia[(w, "max_goodput", arm)], ib[(w, "max_goodput", arm)]
            summary.append([w, f"max goodput · {plots.ARM_LABELS[arm]}", _goodput(x),
                            _goodput(y), _change(x.metric, y.metric)])
        sa_s = a.sweep.series(w, "spec").set_index("concurrency")
        sb_s = b.sweep.series(w, "spec").set_index("concurrency")
        for c in sorted(set(sa_s.index) & set(sb_s.index)):
            ra, rb = sa_s.loc[c], sb_s.loc[c]
            steps.append([w, fmt(c, "g"), _n(ra), _n(rb), fmt(ra.tpot_p50_ms, ".1f"),
                          fmt(rb.tpot_p50_ms, ".1f"), _change(ra.tpot_p50_ms, rb.tpot_p50_ms),
                          fmt(ra.output_tokens_per_s, ".0f"), fmt(rb.output_tokens_per_s, ".0f"),
                          _change(ra.output_tokens_per_s, rb.output_tokens_per_s),
                          fmt(ra.acceptance_rate, ".2f"), fmt(rb.acceptance_rate, ".2f")])
        ct_a, ct_b = ia[(w, "crossover_tpot", None)], ib[(w, "crossover_tpot", None)]
        tpot = _arrow(_text(sa.tpot_ratio), _text(sb.tpot_ratio))
        lines.append(f"{w}: TPOT speedup at c=1 {tpot}; acceptance "
                     f"{_arrow(fmt(sa.acceptance_rate, '.2f'), fmt(sb.acceptance_rate, '.2f'))};"
                     f" crossover (TPOT) {_arrow(ct_a.summary(), ct_b.summary())}")
    only = sorted(set(a.sweep.workloads) ^ set(b.sweep.workloads))
    if only:
        lines.append(f"measured in only one sweep (not compared): {', '.join(only)}")
    return summary, steps, lines


def round_rows(a: Sweep, b: Sweep) -> list[list[str]]:
    """The speculative arm's engine round per concurrency in both sweeps: draft (of which
    network, for a disaggregated drafter), verify, and rounds behind them. Empty when neither
    server reports round timings (vLLM, SGLang, llama.cpp)."""
    rows = []
    for w in (w for w in a.workloads if w in b.workloads):
        sa = a.series(w, "spec").set_index("concurrency")
        sb = b.series(w, "spec").set_index("concurrency")
        for c in sorted(set(sa.index) & set(sb.index)):
            ra, rb = sa.loc[c], sb.loc[c]
            if not any(ev.finite(r.get("draft_ms_per_round")) for r in (ra, rb)):
                continue
            rows.append([w, fmt(c, "g")] + [
                fmt(r.get(col), ".2f") for col in ("draft_ms_per_round", "network_ms_per_round",
                                                   "verify_ms_per_round") for r in (ra, rb)]
                + [fmt(r.get("rounds"), ",.0f") for r in (ra, rb)])
    return rows


def _no_intervals(s: Sweep) -> str | None:
    return (s.info.get("peer") or {}).get("no_intervals")


def peer_notes(a: Sweep, b: Sweep) -> list:
    """What the files of a side measured by another tool (``peers``) lack, one line each."""
    lines = [f"{s.label}: {n}" for s in (a, b) if s.info.get("peer")
             for n in s.info.get("notes") or []]
    setups = [f"{s.label}: {s.info['peer']['setup']}" for s in (a, b) if s.info.get("peer")]
    return [Bullets(setups + lines)] if lines or setups else []


def _goodput(bp: bpm.BreakPoint) -> str:
    if bp.status != bpm.FOUND:
        return bp.headline()
    return f"{fmt(bp.metric, '.3g')} req/s at c={fmt(bp.concurrency, 'g')} — {bp.basis}"


def _n(row) -> str:
    n = ev.successful(row)
    return "?" if n is None else str(n)


def compare(dir_a: str | Path, dir_b: str | Path, out: str | Path,
            min_requests: int | None = None, cost: CostInputs | None = None) -> Compared:
    a, b = _labels(load_sweep(dir_a), load_sweep(dir_b))
    a, b = (with_options(s, None, min_requests, cost) for s in (a, b))
    an_a, an_b = analyse(a), analyse(b)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = plots.plot_all([a, b], [list(an_a.found), list(an_b.found)], out / "plots",
                             an_b.min_requests)
    fig = cost_figure([a, b], [list(an_a.costs), list(an_b.costs)], [an_a.inputs, an_b.inputs],
                      out / "plots" / "cost.png")
    if fig is not None:
        figures["cost"] = fig
    summary, steps, lines = changes(an_a, an_b)
    rounds = round_rows(a, b)
    cost_rows = compare_rows(list(an_a.costs), list(an_b.costs), an_b.inputs)
    title = f"spectest compare — {a.label} vs {b.label}"
    sections = [
        Section("What changed", [Bullets(lines) if lines else "No workload in common.",
                                 f"A = {a.folder} ({a.info.get('status', '?')}), "
                                 f"B = {b.folder} ({b.info.get('status', '?')}). SLOs: A "
                                 f"{a.slo.describe()}; B {b.slo.describe()}.",
                                 ev.method_text(an_b.min_requests)]
                + [n for n in (ev.interval_note(a.table, _no_intervals(a)),
                               ev.interval_note(b.table, _no_intervals(b))) if n][:1]
                + peer_notes(a, b)),
        Section("Break points and speedup, A → B",
                [Table(["workload", "figure", a.label, b.label, "change"], summary)]),
        Section("Cost per 1M output tokens, A → B",
                [Table(["workload", "figure", a.label, b.label, "change"], cost_rows)
                 if cost_rows else "No workload with a cost in both sweeps.",
                 "Assumptions:",
                 Bullets(assumptions(an_b.inputs, b.slo, an_b.min_requests))]),
        Section("Speculative arm per concurrency, A → B", [Table(
            ["workload", "c", f"n {a.label}", f"n {b.label}", f"TPOT p50 {a.label}",
             f"TPOT p50 {b.label}", "change", f"tok/s {a.label}", f"tok/s {b.label}", "change",
             f"acceptance {a.label}", f"acceptance {b.label}"], steps)]),
        *([Section("Engine round of the speculative arm, A → B (ms per round)", [
            "Mean milliseconds per engine round from the servers' round histograms. Draft "
            "includes the network term of a drafter in another process (`spectest serve "
            "--draft-url`): its round trip minus the draft model's own time, paid once per "
            "round; 0 when the draft is co-located.",
            Table(["workload", "c", f"draft {a.label}", f"draft {b.label}",
                   f"network {a.label}", f"network {b.label}", f"verify {a.label}",
                   f"verify {b.label}", f"rounds {a.label}", f"rounds {b.label}"], rounds)])]
          if rounds else []),
        Section("Figures (A solid, B dashed)",
                [Image(p, "K advisor of B" if name == "k_advisor" else name.replace("_", " "))
                 for name, p in figures.items()]),
    ]
    md, page = out / "compare.md", out / "compare.html"
    atomic_write(md, to_markdown(title, sections, out))
    atomic_write(page, to_html(title, sections))
    return Compared(page, md, lines)
