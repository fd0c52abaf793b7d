"""``report.md`` and a self-contained ``report.html`` for one sweep folder.

The page answers, per workload and in this order: how much faster is speculation at
concurrency 1; at what load does it stop paying (crossover); where do the SLOs break and where
does the server saturate, per arm; what is the best goodput; what does a million output tokens
cost per arm and how many replicas carry the target load; what K to run at each load. Every
figure carries the requests behind it and its interval, or says "not enough data". Then the
figures (``plots/*.png``, embedded in the HTML as base64 so the file can be mailed) and the
per-step table (``steps.csv`` is beside it). Also written: ``breakpoints.csv`` (every break
point with its evidence and basis), ``cost.csv`` (every step's cost), ``k_advice.csv`` and
``k_profile.json`` (the advice as a profile for ``spectest serve --k-policy goodput
--profile``) and ``schedule.json`` (the speculation schedule per workload and for the mix, in
every server's words: ``schedule``).

The document is built once (``sections``, ``cost_section``) and written twice — as Markdown
and as HTML (``document``) — so the two never disagree. It reads the folder and writes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectest.report import advisor, outliers, plots
from spectest.report import breakpoints as bpm
from spectest.report import cost as costm
from spectest.report import schedule as sch
from spectest.report.advice_section import (
    configuration_section,
    measured_flavour,
    verification_section,
)
from spectest.report.cost_section import cost_lines, cost_section
from spectest.report.document import (  # noqa: F401 (re-exported: the report's page model)
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
from spectest.report.plots_cost import cost_figure
from spectest.report.sections import (
    Analysis,
    analyse,
    breakpoints_section,
    k_section,
    setup_section,
    speed_sentence,
    speedup_section,
    steps_section,
    verdict,
    with_options,
)
from spectest.report.table import SLO, Sweep, load_sweep

CAPTIONS = {"speedup": "Speedup over the baseline with 95 % intervals: above 1 speculation "
                       "pays, below it costs; X marks each crossover, ○ steps with too few "
                       "requests.",
            "throughput": "Output throughput per arm; ▼ marks the saturation knee.",
            "tpot": "TPOT p50 (solid) and p99 (dotted) per arm; red dashed: the SLO.",
            "ttft": "TTFT p50 (solid) and p99 (dotted) per arm (log scale).",
            "acceptance": "Acceptance rate and mean accepted length of the speculative arm.",
            "acceptance_per_position": "Per-position acceptance: share of drafts whose first i "
                                       "tokens were all accepted.",
            "k_advisor": "K advisor: predicted speedup vs K at each concurrency."}


SCHEDULE_JSON = "schedule.json"


def schedule_json(an: Analysis) -> str:
    """Every schedule with what it rests on, and each in every server's words."""
    import json

    cfg = an.sweep.info.get("config") or {}
    data = {"objective": cfg.get("objective") or "both", "mix": cfg.get("mix") or "",
            "schedules": [{**s.to_json(),
                           "flags": {f.key: sch.render(s, f, cfg.get("speculative_config"))
                                     for f in sch.flavours.FLAVOURS},
                           "vllm_per_batch_size": sch.vllm_schedule(s),
                           "spectest_serve_args": sch.spectest_serve_args(s)}
                          for s in an.schedules]}
    return json.dumps(data, indent=2, default=str) + "\n"


@dataclass(frozen=True)
class Rendered:
    html: Path
    markdown: Path
    plots: dict


def document(an: Analysis, figures: dict) -> list[Section]:
    cost_fig = figures.get("cost")
    verified = verification_section(an.sweep.table, list(an.schedules), an.sweep.info,
                                    an.min_requests)
    return [Section("Verdict", [Bullets([verdict(an, w) for w in an.sweep.workloads])]),
            setup_section(an), speedup_section(an), breakpoints_section(an),
            configuration_section(list(an.schedules), an.sweep.info),
            *([verified] if verified is not None else []),
            cost_section(list(an.costs), an.inputs, an.sweep.slo, an.min_requests, cost_fig),
            Section("Figures", [Image(p, CAPTIONS.get(name, name)) for name, p in
                                figures.items() if name not in ("k_advisor", "cost")]),
            k_section(an, figures.get("k_advisor")),
            outliers.section(an.sweep.table, an.sweep.folder), steps_section(an.sweep)]


def breakpoints_frame(found) -> pd.DataFrame:
    return pd.DataFrame([{"workload": b.workload, "kind": b.kind, "arm": b.arm or "",
                          "status": b.status, "concurrency": b.concurrency, "lower": b.lower,
                          "upper": b.upper, "metric": b.metric,
                          "metric_low": b.interval[0] if b.interval else None,
                          "metric_high": b.interval[1] if b.interval else None,
                          "basis": b.basis, "evidence": b.evidence,
                          "notes": " | ".join(b.notes)} for b in found])


def cost_frame(an: Analysis) -> pd.DataFrame:
    rows = []
    for wc in an.costs:
        for arm, pl in wc.plans.items():
            for p in pl.points:
                band = p.cost_interval
                rows.append({"workload": wc.workload, "arm": arm, "concurrency": p.concurrency,
                             "successful_requests": p.n, "goodput_tokens_per_s": p.goodput_tps,
                             "goodput_estimated": p.estimated, "price_per_hour": p.price,
                             "cost_per_1m_tokens": p.cost if p.price else None,
                             "replica_hours_per_1m_tokens":
                                 p.cost / p.price if p.price and p.cost else p.cost,
                             "cost_low": band[0] if band else None,
                             "cost_high": band[1] if band else None,
                             "operating_point": p.usable, "cheapest": p is pl.cheapest,
                             "excluded_because": p.why_not() if not p.usable else "",
                             "replicas": pl.replicas if p is pl.cheapest else None})
    return pd.DataFrame(rows)


def render_report(folder: str | Path, out: str | Path | None = None,
                  slo: SLO | None = None, min_requests: int | None = None,
                  cost: costm.CostInputs | None = None,
                  network_ms: float | None = None, advice: dict | None = None) -> Rendered:
    """Render ``folder`` (a sweep) into ``out`` (default: the folder itself); ``slo``,
    ``min_requests`` and ``cost`` override what the sweep ran with; ``network_ms`` gives the
    K advice a what-if network term per round; ``advice``: the schedule's options."""
    sweep = with_options(load_sweep(folder), slo, min_requests, cost, network_ms, advice)
    out = Path(out) if out else sweep.folder
    out.mkdir(parents=True, exist_ok=True)
    an = analyse(sweep)
    figures = plots.plot_all([sweep], [list(an.found)], out / "plots", an.min_requests)
    figure = cost_figure([sweep], [list(an.costs)], [an.inputs], out / "plots" / "cost.png")
    if figure is not None:
        figures["cost"] = figure
    title = f"spectest sweep report — {sweep.label}"
    sections = document(an, figures)
    md, page = out / "report.md", out / "report.html"
    atomic_write(md, to_markdown(title, sections, out))
    atomic_write(page, to_html(title, sections))
    atomic_write(out / "breakpoints.csv", breakpoints_frame(an.found).to_csv(index=False))
    atomic_write(out / "cost.csv", cost_frame(an).to_csv(index=False))
    atomic_write(out / "k_advice.csv", advisor.advice_frame(list(an.advice)).to_csv(index=False))
    atomic_write(out / SCHEDULE_JSON, schedule_json(an))
    profile = advisor.profile_json(sweep.table[sweep.table.arm.isin(["spec", "base"])],
                                   min_requests=an.min_requests)
    if profile is not None:
        atomic_write(out / "k_profile.json", advisor.profile_text(profile))
    return Rendered(page, md, figures)


def summary_lines(folder: str | Path, slo: SLO | None = None, min_requests: int | None = None,
                  cost: costm.CostInputs | None = None, sweep: Sweep | None = None,
                  advice: dict | None = None) -> list[str]:
    """Terminal lines: per workload the speedup at c=1, the break points and the cost, each
    with the requests behind it and its interval (or "not enough data"), and the schedule in
    the measured server's words."""
    an = analyse(with_options(sweep or load_sweep(folder), slo, min_requests, cost,
                              advice=advice))
    flavour = sch.flavours.BY_KEY.get(measured_flavour(an.sweep.info))
    spec_cfg = (an.sweep.info.get("config") or {}).get("speculative_config")
    schedules = {s.name: s for s in an.schedules}

    def advice_line(name: str) -> list[str]:
        s = schedules.get(name)
        if s is None:
            return []
        where = (f"; {flavour.display}: {sch.render(s, flavour, spec_cfg)}"
                 if flavour is not None and s.status != sch.NONE else "")
        return [f"  schedule {s.why}{where}"]
    t = an.sweep.table
    by = {(b.workload, b.kind, b.arm): b for b in an.found}
    lines = []
    for w in an.sweep.workloads:
        s = bpm.speedup_at(t, w, min_requests=an.min_requests)
        head = f"{w}: at c={fmt(s.concurrency, 'g')} {speed_sentence(s).replace('**', '')}"
        if not s.enough:
            alt = bpm.first_supported(t, w, an.min_requests)
            if alt is not None and alt.concurrency != s.concurrency:
                head += (f"; at c={alt.concurrency:g} (lowest with enough data) "
                         f"{speed_sentence(alt).replace('**', '')}")
        lines.append(head)
        lines.append(f"  crossover TPOT {by[(w, 'crossover_tpot', None)].summary()}")
        lines.append(f"  crossover throughput {by[(w, 'crossover_throughput', None)].summary()}")
        for arm in ("spec", "base"):
            if (w, "slo", arm) in by:
                g = by[(w, "max_goodput", arm)]
                best = (f"{fmt(g.metric, '.3g')} req/s at c={fmt(g.concurrency, 'g')} "
                        f"({g.basis})" if g.status == bpm.FOUND else g.headline())
                lines.append(f"  {plots.ARM_LABELS[arm]}: SLO break "
                             f"{by[(w, 'slo', arm)].summary()}; knee "
                             f"{by[(w, 'knee', arm)].summary()}; max goodput {best}")
        lines += cost_lines([wc for wc in an.costs if wc.workload == w], an.inputs)[:1]
        lines += advice_line(w)
    if sch.MIX in schedules:
        lines.append("traffic mix (" + ", ".join(f"{w} {v:.0%}" for w, v in
                                                schedules[sch.MIX].weights.items()) + "):")
        lines += advice_line(sch.MIX)
    lines += [x for x in cost_lines([], an.inputs)]
    return lines
