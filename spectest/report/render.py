"""``report.md`` and a self-contained ``report.html`` for one sweep folder.

The page answers, per workload and in this order: how much faster is speculation at
concurrency 1; at what load does it stop paying (crossover); where do the SLOs break and where
does the server saturate, per arm; what is the best goodput; what K to run at each load. Then
the figures (``plots/*.png``, embedded in the HTML as base64 so the file can be mailed) and the
per-step table (``steps.csv`` is beside it). Also written: ``breakpoints.csv`` (every break
point with its evidence), ``k_advice.csv`` and ``k_profile.json`` (the advice as a profile for
``spectest serve --k-policy goodput --profile``).

The document is built once as a list of sections (text, bullet lists, tables, images) and
written twice — as Markdown and as HTML — so the two never disagree. It reads the folder and
writes files; the numbers come from ``breakpoints`` and ``advisor``.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from spectest.report import advisor, plots
from spectest.report import breakpoints as bpm
from spectest.report.table import SLO, STEPS_CSV, Sweep, load_sweep


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    path: Path
    caption: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list = field(default_factory=list)


@dataclass(frozen=True)
class Rendered:
    html: Path
    markdown: Path
    plots: dict


def fmt(v, spec: str = ".3g", unit: str = "", none: str = "–") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return none
    return none if not math.isfinite(x) else format(x, spec) + unit


def _x(v) -> str:
    return fmt(v, ".2f", "×")


def atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)


# --- the document ---------------------------------------------------------------------------
def verdict(sweep: Sweep, w: str, found: list[bpm.BreakPoint]) -> str:
    s = bpm.speedup_at(sweep.table, w)
    by = {(b.kind, b.arm): b for b in found if b.workload == w}
    if s.concurrency is None:
        return f"**{w}**: no concurrency was measured with both arms."
    where = "concurrency 1" if s.concurrency == 1 else f"concurrency {s.concurrency:g} " \
                                                       f"(the lowest step both arms ran)"
    faster = s.tpot is not None and s.tpot > 1
    text = (f"**{w}**: at {where} speculation is **{_x(s.tpot)}** "
            f"{'faster' if faster else 'as fast (slower)'} per output token (throughput "
            f"{_x(s.throughput)}; acceptance {fmt(s.acceptance_rate, '.2f')}, mean accepted "
            f"length {fmt(s.mean_accepted_length, '.2f')}). ")
    ct, cq = by.get(("crossover_tpot", None)), by.get(("crossover_throughput", None))
    crossings = "; ".join(_crossing(b, m) for b, m in ((ct, "TPOT"), (cq, "throughput"))
                          if b is not None)
    return text + crossings[:1].upper() + crossings[1:] + "."


def _crossing(bp: bpm.BreakPoint, metric: str) -> str:
    dips = [m.group(1) for n in bp.notes if (m := re.search(r"at c=([\d.]+)", n))]
    but = (f" (though no better at c={', '.join(dips)}, then ahead again: noise?)"
           if dips else "")
    if bp.status == bpm.FOUND:
        return (f"on {metric} it stops paying at **c ≈ {bp.concurrency:.1f}** (between "
                f"{bp.lower:g} and {bp.upper:g}){but}")
    if bp.status == bpm.BELOW:
        return f"on {metric} it is no better even at the lowest step (c={bp.concurrency:g})"
    if bp.status == bpm.NOT_REACHED:
        return f"on {metric} it still pays at the highest step measured (c={bp.upper:g}){but}"
    return f"no {metric} crossover (no data)"


def document(sweep: Sweep, found: list[bpm.BreakPoint], figures: dict) -> list[Section]:
    info, t = sweep.info, sweep.table
    cfg = info.get("config", {})
    sections = [Section("Verdict", [Bullets([verdict(sweep, w, found)
                                             for w in sweep.workloads])])]
    status = info.get("status", "unknown")
    setup = [
        f"Status: **{status}** — {len(t)} steps measured"
        + (f" in {fmt(info.get('elapsed_s'), '.0f')} s" if info.get("elapsed_s") else "") + ".",
        f"Server: {_server(info)}.",
        f"Workloads {', '.join(sweep.workloads)}; concurrency "
        f"{', '.join(str(c) for c in cfg.get('steps', sorted(set(t.concurrency))))}; "
        f"{fmt(cfg.get('warmup_s'), 'g')} s warm-up then {fmt(cfg.get('step_time_s'), 'g')} s "
        f"measured per step and arm ({cfg.get('windows', '?')} windows); max tokens "
        f"{cfg.get('max_tokens', '?')}; temperature {cfg.get('temperature', '?')}; "
        f"seed {cfg.get('seed', '?')}.",
        f"SLOs: {sweep.slo.describe()}.",
        f"Step resolution: {bpm.resolution(t)}.",
    ]
    machine = info.get("machine") or {}
    if machine:
        setup.append(busy_machine(machine, t))
    notes = list(info.get("notes") or [])
    sections.append(Section("Setup", [Bullets(setup)] + ([Bullets(notes)] if notes else [])))

    rows = []
    for w in sweep.workloads:
        s = bpm.speedup_at(t, w)
        rows.append([w, fmt(s.concurrency, "g"), _x(s.tpot), _x(s.throughput), _x(s.e2el),
                     fmt(s.acceptance_rate, ".2f"), fmt(s.mean_accepted_length, ".2f")])
    sections.append(Section("Speedup at concurrency 1", [Table(
        ["workload", "c", "TPOT speedup", "throughput ratio", "E2EL speedup", "acceptance",
         "mean accepted length"], rows),
        "TPOT speedup = baseline TPOT p50 / speculative TPOT p50; throughput ratio = speculative "
        "output tokens/s / baseline; E2EL speedup likewise on end-to-end latency p50."]))

    by = {(b.workload, b.kind, b.arm): b for b in found}
    cross = [[w, by[(w, "crossover_tpot", None)].headline(),
              by[(w, "crossover_throughput", None)].headline()] for w in sweep.workloads]
    per_arm = []
    for w in sweep.workloads:
        for arm in ("spec", "base"):
            if (w, "slo", arm) not in by:
                continue
            g = by[(w, "max_goodput", arm)]
            per_arm.append([w, plots.ARM_LABELS[arm], by[(w, "slo", arm)].headline(),
                            by[(w, "knee", arm)].headline(),
                            f"{fmt(g.metric, '.3g')} req/s at c={fmt(g.concurrency, 'g')}"
                            if g.status == bpm.FOUND else g.headline()])
    evidence = [f"{b.workload} · {b.kind.replace('_', ' ')}"
                + (f" · {plots.ARM_LABELS.get(b.arm, b.arm)}" if b.arm else "")
                + f": {b.evidence}" + "".join(f" (note: {n})" for n in b.notes)
                for b in found]
    sections.append(Section("Break points", [
        "**Speculation crossover** — the lowest concurrency at which speculation is no better "
        "than the baseline (TPOT p50; throughput separately):",
        Table(["workload", "crossover (TPOT)", "crossover (throughput)"], cross),
        "**Per arm** — SLO break point (the highest concurrency meeting every SLO), saturation "
        "knee (throughput stops growing while latency rises) and the best goodput measured:",
        Table(["workload", "arm", "SLO break point", "saturation knee", "max goodput"],
              per_arm),
        "Evidence, from the measured steps:", Bullets(evidence)]))

    captions = {"speedup": "Speedup over the baseline: above 1 speculation pays, below it "
                           "costs; X marks each crossover.",
                "throughput": "Output throughput per arm; ▼ marks the saturation knee.",
                "tpot": "TPOT p50 (solid) and p99 (dotted) per arm; red dashed: the SLO.",
                "ttft": "TTFT p50 (solid) and p99 (dotted) per arm (log scale).",
                "acceptance": "Acceptance rate and mean accepted length of the speculative "
                              "arm.",
                "acceptance_per_position": "Per-position acceptance: share of drafts whose "
                                           "first i tokens were all accepted.",
                "k_advisor": "K advisor: predicted speedup vs K at each concurrency."}
    sections.append(Section("Figures", [Image(p, captions.get(name, name))
                                        for name, p in figures.items() if name != "k_advisor"]))
    sections.append(k_section(sweep, figures.get("k_advisor")))
    sections.append(steps_section(sweep))
    return sections


def busy_machine(machine: dict, t: pd.DataFrame) -> str:
    """The machine line, with a warning when other work competed with the sweep."""
    cpus = machine.get("cpus") or 0
    loads = [float(x) for x in t.get("loadavg", pd.Series(dtype=float)).dropna()]
    loads += [float((machine.get("loadavg_at_start") or [0])[0])]
    text = (f"Machine: {cpus} CPUs; 1-minute load average {min(loads):.1f}–{max(loads):.1f} "
            f"during the sweep (its own server and client count for about 2 when embedded).")
    if cpus and max(loads) > cpus + 2:
        text += (f" **The machine was busy with other work (load up to {max(loads):.1f} on "
                 f"{cpus} CPUs): differences between arms of a few tens of percent may be "
                 f"noise; re-run on a quiet machine or with longer --step-time.**")
    return text


def _server(info: dict) -> str:
    server, hosts = info.get("server") or {}, info.get("hosts") or {}
    cfg = info.get("config") or {}
    if server.get("embedded"):
        return (f"bundled `spectest serve` (model {server.get('model', '?')}, draft "
                f"{cfg.get('draft', '?')}, K={cfg.get('k', '?')}), one server for both arms "
                f"switched per request")
    if hosts.get("base") and hosts.get("base") != hosts.get("spec"):
        return f"candidate {hosts.get('spec')} vs baseline {hosts.get('base')}"
    return f"{hosts.get('spec', '?')} (both arms, switched per request)"


def k_section(sweep: Sweep, figure: Path | None) -> Section:
    advice = [a for w in sweep.workloads for a in advisor.advise(sweep.table, w)]
    if not advice:
        return Section("K advisor", ["No advice: the sweep has no per-position acceptance or "
                                     "no K (the speculative arm did not report them)."])
    rows = [[a.workload, fmt(a.concurrency, "g"), str(a.k_run), fmt(a.c_eff, ".3f"),
             _x(a.measured_at_run), _x(a.predicted_at_run),
             "off" if a.best_k == 0 else str(a.best_k), _x(a.predicted_best),
             (f"{_x(a.validated)} (mean K {fmt(a.validated_k, '.1f')})"
              if a.validated is not None else "–"),
             "" if a.plausible else "costs implausible (noise)"] for a in advice]
    src = sorted({a.source for a in advice})
    blocks = [
        "From the measured per-position acceptance p_i and the measured cost of a speculative "
        "round relative to a plain target step, the seeds' formula predicts the speedup at "
        "each K: speedup(K) = (1 + Σ_{i<K} p_i) / (1 + c·K), with c (overhead per draft "
        "token) measured at each concurrency — it grows with load because verifying B·K extra "
        "tokens stops being free. Positions past the K that ran are continued geometrically; "
        f"costs come from {' and '.join(src)} and are assumed linear in K.",
        Table(["workload", "c", "K run", "c (cost/draft token)", "measured speedup",
               "predicted at K run", "best K", "predicted at best K", "validated", "note"],
              rows)]
    if not all(a.plausible for a in advice):
        blocks.append("\"costs implausible\": at that load the speculative round measured "
                      "cheaper than a plain target round, which cannot be — the two arms ran "
                      "under different background load. Do not trust that row's K.")
    if figure is not None:
        blocks.append(Image(figure, "Predicted speedup vs K per concurrency: ★ best K, × "
                                    "measured at the K that ran, ◆ the advised policy run."))
    blocks.append("`k_advice.csv` has this table; `k_profile.json` is the advice pooled over "
                  "the workloads, ready for `spectest serve --k-policy goodput --profile "
                  "k_profile.json`.")
    return Section("K advisor", blocks)


STEP_COLUMNS = (("workload", "workload", None), ("arm", "arm", None), ("c", "concurrency", "g"),
                ("req", "requests", "g"), ("fail", "failures", "g"),
                ("TTFT p50", "ttft_p50_ms", ".0f"), ("TTFT p99", "ttft_p99_ms", ".0f"),
                ("TPOT p50", "tpot_p50_ms", ".1f"), ("TPOT p99", "tpot_p99_ms", ".1f"),
                ("E2EL p99", "e2el_p99_ms", ".0f"), ("tok/s", "output_tokens_per_s", ".0f"),
                ("±", "output_tokens_per_s_rse", ".0%"), ("goodput", "goodput_rps", ".2f"),
                ("accept", "acceptance_rate", ".2f"), ("len", "mean_accepted_length", ".2f"),
                ("K", "k", ".3g"), ("load", "loadavg", ".1f"))


def steps_section(sweep: Sweep) -> Section:
    t = sweep.table.sort_values(["workload", "concurrency", "arm"], key=lambda s: s.map(
        {w: i for i, w in enumerate(sweep.workloads)}) if s.name == "workload" else s)
    rows = [[str(r[col]) if spec is None else fmt(r[col], spec) for _, col, spec in STEP_COLUMNS]
            for _, r in t.iterrows()]
    return Section("Per-step measurements", [
        f"Latencies in ms; ± is the relative standard error of throughput across the measured "
        f"windows. Every column is in `{STEPS_CSV}`; each step's requests are under `runs/`.",
        Table([h for h, _, _ in STEP_COLUMNS], rows)])


# --- writers --------------------------------------------------------------------------------
def to_markdown(title: str, sections: list[Section], base: Path) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, str):
                out += [b, ""]
            elif isinstance(b, Bullets):
                out += [f"- {x}" for x in b.items] + [""]
            elif isinstance(b, Table):
                out += ["| " + " | ".join(b.header) + " |",
                        "|" + "|".join("---" for _ in b.header) + "|"]
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |"
                        for r in b.rows] + [""]
            elif isinstance(b, Image):
                out += [f"![{b.caption}]({os.path.relpath(b.path, base)})", "", f"*{b.caption}*",
                        ""]
    return "\n".join(out)


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", s)


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}h1{font-size:1.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}th,td{border:1px solid #ccc;
padding:.25em .55em;text-align:left}th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}figcaption{color:#555;
font-size:.9em}code{background:#f3f3f3;padding:0 .25em}li{margin:.25em 0}"""


def to_html(title: str, sections: list[Section]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, str):
                out.append(f"<p>{_inline(b)}</p>")
            elif isinstance(b, Bullets):
                out.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.items) + "</ul>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r)
                               + "</tr>" for r in b.rows)
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif isinstance(b, Image):
                data = base64.b64encode(b.path.read_bytes()).decode("ascii")
                out.append(f'<figure><img alt="{html.escape(b.caption)}" '
                           f'src="data:image/png;base64,{data}"><figcaption>'
                           f"{html.escape(b.caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def breakpoints_frame(found: list[bpm.BreakPoint]) -> pd.DataFrame:
    return pd.DataFrame([{"workload": b.workload, "kind": b.kind, "arm": b.arm or "",
                          "status": b.status, "concurrency": b.concurrency, "lower": b.lower,
                          "upper": b.upper, "metric": b.metric, "evidence": b.evidence,
                          "notes": " | ".join(b.notes)} for b in found])


def render_report(folder: str | Path, out: str | Path | None = None,
                  slo: SLO | None = None) -> Rendered:
    """Render ``folder`` (a sweep) into ``out`` (default: the folder itself)."""
    sweep = load_sweep(folder)
    if slo is not None:
        sweep = replace(sweep, info={**sweep.info, "slo": slo.to_json()})
    out = Path(out) if out else sweep.folder
    out.mkdir(parents=True, exist_ok=True)
    found = bpm.find_all(sweep.table, sweep.slo, sweep.workloads)
    figures = plots.plot_all([sweep], [found], out / "plots")
    title = f"spectest sweep report — {sweep.label}"
    sections = document(sweep, found, figures)
    md, page = out / "report.md", out / "report.html"
    atomic_write(md, to_markdown(title, sections, out))
    atomic_write(page, to_html(title, sections))
    atomic_write(out / "breakpoints.csv", breakpoints_frame(found).to_csv(index=False))
    advice = [a for w in sweep.workloads for a in advisor.advise(sweep.table, w)]
    atomic_write(out / "k_advice.csv", advisor.advice_frame(advice).to_csv(index=False))
    profile = advisor.profile_json(sweep.table[sweep.table.arm.isin(["spec", "base"])])
    if profile is not None:
        atomic_write(out / "k_profile.json", advisor.profile_text(profile))
    return Rendered(page, md, figures)


def summary_lines(folder: str | Path, slo: SLO | None = None) -> list[str]:
    """A few terminal lines: per workload the speedup at c=1 and the break points."""
    sweep = load_sweep(folder)
    found = bpm.find_all(sweep.table, slo or sweep.slo, sweep.workloads)
    by = {(b.workload, b.kind, b.arm): b for b in found}
    lines = []
    for w in sweep.workloads:
        s = bpm.speedup_at(sweep.table, w)
        lines.append(f"{w}: at c={fmt(s.concurrency, 'g')} speculation TPOT {_x(s.tpot)}, "
                     f"throughput {_x(s.throughput)} (acceptance "
                     f"{fmt(s.acceptance_rate, '.2f')}); crossover TPOT "
                     f"{by[(w, 'crossover_tpot', None)].headline()}, throughput "
                     f"{by[(w, 'crossover_throughput', None)].headline()}")
        for arm in ("spec", "base"):
            if (w, "slo", arm) in by:
                lines.append(f"  {plots.ARM_LABELS[arm]}: SLO break "
                             f"{by[(w, 'slo', arm)].headline()}; knee "
                             f"{by[(w, 'knee', arm)].headline()}")
    return lines
