"""The cost section of the report, its terminal lines, and its rows in ``spectest compare``.

Words and tables around ``cost.analyse``: per workload and arm the cheapest SLO-meeting point,
its cost per 1M output tokens and replicas for the target load, speculation's saving with its
interval and the requests behind it, every step's cost, the figure, and the assumptions printed
next to the figures. Numbers come from ``cost``; this module only words them.
"""

from __future__ import annotations

from pathlib import Path

from spectest.report import cost as costm
from spectest.report import evidence as ev
from spectest.report.document import Bullets, Image, Section, Table, fmt
from spectest.report.plots import ARM_LABELS
from spectest.report.table import SLO


def unit(inputs: costm.CostInputs) -> str:
    return "per 1M output tokens" if inputs.priced else "replica-hours per 1M output tokens"


def money(v, inputs: costm.CostInputs) -> str:
    return fmt(v, ".3g") if inputs.priced else fmt(v, ".3g", " h")


def cost_cell(p: costm.Point | None, inputs: costm.CostInputs) -> str:
    if p is None or p.cost is None:
        return "–"
    band = p.cost_interval
    shown = money(p.cost, inputs)
    if band:
        return f"{shown} ({ev.CONFIDENCE:.0%}: {money(band[0], inputs)}–{money(band[1], inputs)})"
    return shown + (" (estimated; interval unavailable)" if p.estimated
                    else " (interval unavailable)")


def replicas_cell(plan: costm.Plan, inputs: costm.CostInputs) -> str:
    if plan.replicas is None:
        return "–" if plan.cheapest is not None else plan.reason
    span = plan.replicas_range
    text = str(plan.replicas)
    if span and span[0] != span[1]:
        text += f" ({ev.CONFIDENCE:.0%}: {span[0]}–{span[1]})"
    if plan.fleet_per_hour is not None:
        text += f"; {fmt(plan.fleet_per_hour, '.4g')} per hour"
    return text


def saving_text(sv: costm.Saving | None, wc: costm.WorkloadCost) -> str:
    """'speculation saves 42% per token (95% interval 30%–51%; n = 40 spec at c=8 / …)'."""
    if sv is None:
        missing = [f"{ARM_LABELS.get(a, a)}: {p.reason}" for a, p in wc.plans.items()
                   if p.cheapest is None]
        return "no saving stated — " + ("; ".join(missing) or "one arm was not measured")
    r = sv.ratio
    basis = (f"n = {r.n_spec} spec at c={sv.spec.concurrency:g} / {r.n_base} base at "
             f"c={sv.base.concurrency:g}; " + (
                 f"{ev.CONFIDENCE:.0%} interval {sv.interval[0]:+.0%} to {sv.interval[1]:+.0%}"
                 if sv.interval else r.interval()))
    j = r.judgement
    if j in (ev.THIN, ev.UNRESOLVED):
        return f"not enough data to tell a saving from a loss ({basis})"
    if j == ev.EVEN:
        return f"no cost difference that matters: {sv.saving:+.0%} ({basis})"
    word = "saves" if sv.saving > 0 else "costs"
    amount = f"{abs(sv.saving):.0%}" + ("" if sv.saving > 0 else " more")
    fleet = ""
    if sv.replicas[0] is not None and sv.replicas[1] is not None:
        fleet = f"; for the target load {sv.replicas[0]} replicas vs {sv.replicas[1]}"
        if sv.fleet_saving_per_hour is not None:
            x = sv.fleet_saving_per_hour
            fleet += (f", {abs(x):.4g} per hour {'less' if x >= 0 else 'more'} with "
                      f"speculation")
    return f"speculation {word} {amount} per output token ({basis}){fleet}"


def cost_section(analysis: list[costm.WorkloadCost], inputs: costm.CostInputs, slo: SLO,
                 min_requests: int, figure: Path | None) -> Section:
    estimated = any(p.estimated for wc in analysis for pl in wc.plans.values()
                    for p in pl.points)
    cheapest, steps, savings = [], [], []
    for wc in analysis:
        savings.append(f"**{wc.workload}**: {saving_text(wc.saving, wc)}.")
        for arm, pl in wc.plans.items():
            b = pl.cheapest
            cheapest.append([wc.workload, ARM_LABELS.get(arm, arm),
                             f"c={b.concurrency:g}" if b else pl.reason,
                             fmt(b.goodput_tps, ".4g") if b else "–", cost_cell(b, inputs),
                             replicas_cell(pl, inputs), ev.counts(b.n, arms=False) if b else "–"])
            for p in pl.points:
                steps.append([wc.workload, ARM_LABELS.get(arm, arm), fmt(p.concurrency, "g"),
                              "?" if p.n is None else str(p.n), fmt(p.goodput_tps, ".4g"),
                              cost_cell(p, inputs),
                              "yes" + (" (cheapest)" if p is b else "") if p.usable
                              else p.why_not()])
    target = ("replicas for the target load" if inputs.target_rps or inputs.target_output_tps
              else "replicas (no target load)")
    formula = ("price per hour ÷ (goodput tokens/s × 3600) × 1e6" if inputs.priced else
               "1 ÷ (goodput tokens/s × 3600) × 1e6 — multiply by your price per replica-hour")
    blocks = [
        f"Cost ({unit(inputs)}) = {formula}, where goodput tokens are the output tokens of "
        f"requests that met every SLO. Each arm runs at its "
        f"cheapest measured concurrency that meets the SLOs; the saving compares the two "
        f"arms there, with its {ev.CONFIDENCE:.0%} interval (the goodput intervals combined).",
        Bullets(savings),
        Table(["workload", "arm", "cheapest point", "goodput tok/s", f"cost ({unit(inputs)})",
               target, "requests"], cheapest),
        "Assumptions:", Bullets(costm.assumptions(inputs, slo, min_requests, estimated))]
    if figure is not None:
        blocks.append(Image(figure, f"Cost ({unit(inputs)}) vs concurrency per arm (bars: "
                                    f"{ev.CONFIDENCE:.0%} interval); × misses an SLO, ○ too "
                                    f"few requests, ★ the cheapest operating point."))
    blocks += ["Every measured step:", Table(["workload", "arm", "c", "n", "goodput tok/s",
                                              f"cost ({unit(inputs)})", "operating point"], steps)]
    return Section("Cost and capacity", blocks)


def cost_lines(analysis: list[costm.WorkloadCost], inputs: costm.CostInputs) -> list[str]:
    """Terminal lines: per workload the cheapest cost per arm, replicas and the saving."""
    out = []
    for wc in analysis:
        parts = []
        for arm, pl in wc.plans.items():
            b = pl.cheapest
            if b is None:
                parts.append(f"{arm} {pl.reason}")
                continue
            reps = f", {pl.replicas} replicas" if pl.replicas is not None else ""
            parts.append(f"{arm} {cost_cell(b, inputs)} at c={b.concurrency:g} "
                         f"(n = {b.n}){reps}")
        out.append(f"  cost ({unit(inputs)}): {'; '.join(parts)}; "
                   f"{saving_text(wc.saving, wc)}")
    if not inputs.priced:
        out.append("  (no price: pass --price-per-hour [--spec-price-per-hour] for money, "
                   "--target-rps or --target-output-tps for replicas)")
    return out


def compare_rows(a: list[costm.WorkloadCost], b: list[costm.WorkloadCost],
                 inputs: costm.CostInputs) -> list[list[str]]:
    """Rows for ``compare``: per workload both sweeps' cheapest cost per arm and saving."""
    ib = {wc.workload: wc for wc in b}
    rows = []
    for wa in a:
        wb = ib.get(wa.workload)
        if wb is None:
            continue
        for arm in ("spec", "base"):
            pa, pb = wa.plans.get(arm), wb.plans.get(arm)
            if pa is None or pb is None:
                continue
            ca, cb = pa.cheapest, pb.cheapest
            rows.append([wa.workload, f"cheapest cost · {ARM_LABELS[arm]}",
                         f"{cost_cell(ca, inputs)} at c={ca.concurrency:g}" if ca else pa.reason,
                         f"{cost_cell(cb, inputs)} at c={cb.concurrency:g}" if cb else pb.reason,
                         fmt(cb.cost / ca.cost - 1, "+.0%") if ca and cb else "–"])
        rows.append([wa.workload, "saving from speculation", saving_text(wa.saving, wa),
                     saving_text(wb.saving, wb), "–"])
    return rows
