"""The report's PNGs (matplotlib, Agg): one figure per question, one panel per workload.

* ``speedup.png`` — speculation's speedup over the baseline vs concurrency (TPOT and
  throughput) with 95 % interval bars, green above 1, red below, crossovers marked, steps with
  too few requests hollow: the figure to read first;
* ``throughput.png``, ``tpot.png``, ``ttft.png`` — both arms vs concurrency (p50 solid, p99
  dotted), SLO thresholds, crossovers and saturation knees marked;
* ``acceptance.png`` — acceptance rate and mean accepted length vs concurrency per workload;
* ``acceptance_per_position.png`` — P(draft position i accepted), pooled and per step;
* ``k_advisor.png`` — predicted speedup vs K at each concurrency, best K starred, the measured
  speedup at the K that ran and the validated recommendation.

Every function takes a list of sweeps: one sweep → colours are the arms; two (``compare``) →
colours are still the arms, and line style tells the sweeps apart (first solid, second dashed).
Break points are passed in, not recomputed. Figures are built with matplotlib's object API
(``Figure``, no pyplot state), so nothing global changes. It draws; it does not decide.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from spectest.report import advisor
from spectest.report.breakpoints import BELOW, FOUND, BreakPoint, advantage, speedup_at
from spectest.report.evidence import MIN_REQUESTS_PER_STEP
from spectest.report.table import Sweep

ARM_COLOURS = {"spec": "#1a9850", "base": "#4d4d4d", "spec-advised": "#2166ac"}
ARM_LABELS = {"spec": "speculation on", "base": "baseline (off)",
              "spec-advised": "advised schedule", "verify-on": "on (beside the advice)",
              "verify-off": "off (beside the advice)"}
STYLES = ("-", "--", ":")
WORKLOAD_COLOURS = ("#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")
DPI = 110


def _concurrency_axis(ax, sweeps: list[Sweep]) -> None:
    cs = sorted({float(c) for s in sweeps for c in s.table.concurrency.dropna()})
    ax.set_xscale("log", base=2)
    if cs:
        ax.xaxis.set_major_locator(FixedLocator(cs))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{c:g}" for c in cs])
        ax.set_xlim(cs[0] / 1.25, cs[-1] * 1.25)
    ax.set_xlabel("concurrent requests")
    ax.grid(True, which="major", alpha=0.3)


def _panels(sweeps: list[Sweep], title: str, height: float = 3.6):
    workloads = list(dict.fromkeys(w for s in sweeps for w in s.workloads))
    n = max(1, len(workloads))
    fig = Figure(figsize=(4.3 * n + 0.6, height), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, list(axes[0]), workloads


def _label(sweeps: list[Sweep], i: int, arm: str) -> str:
    name = ARM_LABELS.get(arm, arm)
    return f"{sweeps[i].label}: {name}" if len(sweeps) > 1 else name


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=DPI)
    tmp.replace(path)
    return path


def _mark_crossover(ax, bps: list[BreakPoint], workload: str, kind: str, style: str,
                    text: str, row: int = 0) -> None:
    for bp in bps:
        if bp.workload == workload and bp.kind == kind and bp.status == BELOW:
            ax.axvspan(bp.concurrency / 4, bp.concurrency * 1e4, color="#d73027", alpha=0.05)
            ax.annotate(f"{text}: no gain at any step", (0.02, 1.0), xycoords="axes fraction",
                        xytext=(0, -12 - 11 * row), textcoords="offset points",
                        color="#d73027", fontsize=8)
        if bp.workload == workload and bp.kind == kind and bp.status == FOUND:
            ax.axvline(bp.concurrency, color="#d73027", ls=style, lw=1.3, alpha=0.9)
            ax.axvspan(bp.concurrency, ax.get_xlim()[1] * 4, color="#d73027", alpha=0.05)
            ax.annotate(f"{text} ≈ {bp.concurrency:.1f}", (bp.concurrency, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(3, -12 - 11 * row),
                        textcoords="offset points", color="#d73027", fontsize=8)


def _mark_knees(ax, bps: list[BreakPoint], workload: str, sweep_i: int, col: str,
                series_by_arm: dict) -> None:
    for bp in bps:
        if bp.workload != workload or bp.kind != "knee" or bp.status != FOUND:
            continue
        s = series_by_arm.get(bp.arm)
        if s is None or s.empty:
            continue
        y = float(np.interp(math.log2(bp.concurrency), np.log2(s.concurrency.astype(float)),
                            s[col].astype(float)))
        ax.plot([bp.concurrency], [y], marker="v", ms=9, ls="none",
                color=ARM_COLOURS.get(bp.arm, "k"),
                mec="white", zorder=5, label="saturation knee" if sweep_i == 0 else None)


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#777")


def _legend(fig, axes) -> None:
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    if handles:
        fig.legend([handles[k] for k in labels], labels, loc="outside lower center",
                   ncol=min(len(labels), 5), fontsize=8, frameon=False, handlelength=3.5)


# --- figures --------------------------------------------------------------------------------
def speedup(sweeps: list[Sweep], bps: list[list[BreakPoint]], path: Path,
            min_requests: int = MIN_REQUESTS_PER_STEP) -> Path:
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    fig.suptitle("Does speculation pay? Speedup over the baseline at each load",
                 fontsize=12, fontweight="bold")
    specs = (("tpot", "TPOT speedup (baseline TPOT p50 / spec TPOT p50)", "crossover_tpot"),
             ("throughput", "throughput ratio (spec tok/s / baseline tok/s)",
              "crossover_throughput"))
    for ax, (metric, ylabel, kind) in zip(axes, specs):
        ys = []
        for si, s in enumerate(sweeps):
            for wi, w in enumerate(s.workloads):
                adv = advantage(s.table, w, metric, min_requests=min_requests)
                if adv.empty:
                    continue
                colour = WORKLOAD_COLOURS[wi % len(WORKLOAD_COLOURS)]
                label = f"{s.label}: {w}" if len(sweeps) > 1 else w
                x, y = adv.concurrency.to_numpy(), (1 + adv.a).to_numpy()
                lo = (y - adv.low.astype(float)).fillna(0).to_numpy()
                hi = (adv.high.astype(float) - y).fillna(0).to_numpy()
                ax.errorbar(x, y, yerr=[lo, hi], marker="o", color=colour, ls=STYLES[si % 3],
                            lw=2, capsize=3, label=label)
                thin = adv.thin.to_numpy(dtype=bool)
                if thin.any():
                    ax.plot(x[thin], y[thin], marker="o", ms=10, ls="none", mfc="white",
                            mec=colour, mew=1.8, zorder=5)
                ys += list(y) + list(adv.low.dropna()) + list(adv.high.dropna())
                for bp in bps[si]:
                    if bp.workload == w and bp.kind == kind and bp.status == FOUND:
                        ax.plot([bp.concurrency], [1.0], marker="X", ms=11, color=colour,
                                mec="black", zorder=6)
                        row = wi + si * len(s.workloads)
                        ax.annotate(f"{label}: {bp.concurrency:.1f}", (bp.concurrency, 1.0),
                                    xytext=(4, 6 + 10 * row), textcoords="offset points",
                                    fontsize=8, color=colour)
        top = max([1.2] + [y * 1.08 for y in ys])
        bottom = min([0.8] + [y * 0.92 for y in ys])
        ax.set_ylim(bottom, top)
        ax.axhspan(1.0, top, color="#1a9850", alpha=0.08)
        ax.axhspan(bottom, 1.0, color="#d73027", alpha=0.08)
        ax.axhline(1.0, color="black", lw=1)
        ax.text(0.01, 0.97, "speculation faster", transform=ax.transAxes, va="top",
                fontsize=8, color="#1a9850")
        ax.text(0.01, 0.03, "speculation slower", transform=ax.transAxes, va="bottom",
                fontsize=8, color="#d73027")
        ax.set_ylabel(ylabel, fontsize=9)
        _concurrency_axis(ax, sweeps)
    if axes[0].get_legend_handles_labels()[0]:  # none where no step had a ratio to plot
        axes[0].legend(fontsize=8, loc="best", title="workload (X crossover, ○ too few requests)",
                       title_fontsize=8, handlelength=3.5)
    return _save(fig, path)


def arms_vs_concurrency(sweeps: list[Sweep], bps: list[list[BreakPoint]], path: Path, *,
                        title: str, col: str, ylabel: str, p99: str | None = None,
                        slo_col: str | None = None, crossover: str | None = None,
                        knees: bool = False, log_y: bool = False) -> Path:
    fig, axes, workloads = _panels(sweeps, title)
    for ax, w in zip(axes, workloads):
        for si, s in enumerate(sweeps):
            by_arm = {}
            for arm in ("spec", "base", "spec-advised"):
                d = s.series(w, arm)
                d = d[d[col].notna()]
                if d.empty:
                    continue
                by_arm[arm] = d
                colour = ARM_COLOURS[arm]
                ax.plot(d.concurrency, d[col], marker="o", color=colour, ls=STYLES[si % 3],
                        lw=2, label=_label(sweeps, si, arm) + (" p50" if p99 else ""))
                if p99 and d[p99].notna().any():
                    ax.plot(d.concurrency, d[p99], marker=".", color=colour, ls=":", lw=1.2,
                            alpha=0.8, label=_label(sweeps, si, arm) + " p99")
            if knees:
                _mark_knees(ax, bps[si], w, si, col, by_arm)
            if crossover:
                name = "crossover" if len(sweeps) == 1 else f"{s.label} crossover"
                _mark_crossover(ax, bps[si], w, crossover, STYLES[si % 3], name, si)
            limit = s.slo.thresholds.get(slo_col) if slo_col else None
            if limit and si == 0:
                ax.axhline(limit, color="#d73027", ls="--", lw=1, alpha=0.7,
                           label=f"SLO {limit:g} ms (p99)")
        ax.set_title(w, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        _concurrency_axis(ax, sweeps)
    _legend(fig, axes)
    return _save(fig, path)


def acceptance(sweeps: list[Sweep], path: Path) -> Path:
    fig = Figure(figsize=(11, 4.0), layout="constrained")
    axes = fig.subplots(1, 2)
    fig.suptitle("How much of the draft the target accepts, as load rises",
                 fontsize=12, fontweight="bold")
    for si, s in enumerate(sweeps):
        for wi, w in enumerate(s.workloads):
            d = s.series(w, "spec")
            colour = WORKLOAD_COLOURS[wi % len(WORKLOAD_COLOURS)]
            label = f"{s.label}: {w}" if len(sweeps) > 1 else w
            for ax, col in zip(axes, ("acceptance_rate", "mean_accepted_length")):
                dd = d[d[col].notna()]
                if not dd.empty:
                    ax.plot(dd.concurrency, dd[col], marker="o", color=colour,
                            ls=STYLES[si % 3], lw=2, label=label)
    axes[0].set_ylabel("acceptance rate (accepted / drafted)")
    axes[0].set_ylim(0, 1.02)
    axes[1].set_ylabel("mean accepted length (tokens per round)")
    if axes[1].lines:
        axes[1].set_ylim(bottom=1.0, top=max(2.0, axes[1].get_ylim()[1]))
    for ax in axes:
        _concurrency_axis(ax, sweeps)
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    else:
        _no_data(axes[0], "no acceptance figures (did the speculative arm run?)")
    return _save(fig, path)


def acceptance_per_position(sweeps: list[Sweep], path: Path) -> Path:
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    ax.set_title("Per-position acceptance: P(draft token i accepted)", fontsize=12,
                 fontweight="bold")
    for si, s in enumerate(sweeps):
        for wi, w in enumerate(s.workloads):
            colour = WORKLOAD_COLOURS[wi % len(WORKLOAD_COLOURS)]
            p = advisor.position_acceptance(s.table, w)
            if not p:
                continue
            x = np.arange(1, len(p) + 1)
            label = f"{s.label}: {w}" if len(sweeps) > 1 else w
            ax.plot(x, p, marker="o", color=colour, ls=STYLES[si % 3], lw=2.2, label=label)
            d = s.series(w, "spec")
            for _, row in d.iterrows():  # each concurrency, faint: does load change it?
                vals = [row.get(f"acceptance_pos_{i}") for i in range(len(p))]
                if all(v is not None and np.isfinite(v) for v in vals):
                    ax.plot(x, vals, color=colour, lw=0.8, alpha=0.35, ls=STYLES[si % 3])
    if ax.lines:
        ax.set_xticks(range(1, 1 + max(len(line.get_xdata()) for line in ax.lines)))
    ax.set_xlabel("draft position (1 = first drafted token)")
    ax.set_ylabel("share of drafts accepted up to here")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8, title="bold: all steps; faint: each concurrency",
                  title_fontsize=7)
    else:
        _no_data(ax, "no per-position acceptance reported")
    return _save(fig, path)


def k_advisor(sweeps: list[Sweep], path: Path) -> Path | None:
    s = sweeps[-1]  # compare: the newer sweep's advice
    network = (s.info.get("config") or {}).get("network_ms")  # `report --network-ms`
    advice = {w: advisor.advise(s.table, w, network_ms=network) for w in s.workloads}
    advice = {w: a for w, a in advice.items() if a}
    if not advice:
        return None
    fig, axes, _ = _panels([s], "K advisor: predicted speedup vs draft length K", 3.9)
    cmap = matplotlib.colormaps["viridis"]
    for ax, (w, items) in zip(axes, advice.items()):
        for i, a in enumerate(items):
            colour = cmap(i / max(1, len(items) - 1) * 0.85)
            ks = np.arange(len(a.curve))
            ax.plot(ks, a.curve, color=colour, lw=1.8, ls="-" if a.plausible else ":",
                    label=f"c={a.concurrency:g}" + ("" if a.plausible else " (noisy costs)"))
            ax.plot([a.best_k], [a.predicted_best], marker="*", ms=13, color=colour,
                    mec="black")
            if a.measured_at_run is not None:
                ax.plot([a.k_run], [a.measured_at_run], marker="x", ms=9, mew=2, color=colour)
            if a.validated is not None and a.validated_k is not None:
                ax.plot([a.validated_k], [a.validated], marker="D", ms=7, color=colour,
                        mec="black")
        ax.axhline(1.0, color="black", lw=1)
        ax.set_title(w, fontsize=10)
        ax.set_xlabel("draft length K (0 = speculation off)")
        ax.set_ylabel("speedup over the baseline")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, title="★ best K  × measured  ◆ advised", title_fontsize=7,
                  loc="best")
    for ax in axes[len(advice):]:
        ax.set_visible(False)
    return _save(fig, path)


def plot_all(sweeps: list[Sweep], bps: list[list[BreakPoint]], folder: Path,
             min_requests: int = MIN_REQUESTS_PER_STEP) -> dict[str, Path]:
    """Every figure into ``folder``; {name: path} of those drawn."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"speedup": speedup(sweeps, bps, folder / "speedup.png", min_requests),
           "throughput": arms_vs_concurrency(
               sweeps, bps, folder / "throughput.png",
               title="Output throughput vs concurrency", col="output_tokens_per_s",
               ylabel="output tokens / s", crossover="crossover_throughput", knees=True),
           "tpot": arms_vs_concurrency(
               sweeps, bps, folder / "tpot.png", title="Time per output token vs concurrency",
               col="tpot_p50_ms", p99="tpot_p99_ms", ylabel="TPOT (ms)",
               slo_col="tpot_p99_ms", crossover="crossover_tpot"),
           "ttft": arms_vs_concurrency(
               sweeps, bps, folder / "ttft.png", title="Time to first token vs concurrency",
               col="ttft_p50_ms", p99="ttft_p99_ms", ylabel="TTFT (ms)",
               slo_col="ttft_p99_ms", log_y=True),
           "acceptance": acceptance(sweeps, folder / "acceptance.png"),
           "acceptance_per_position": acceptance_per_position(
               sweeps, folder / "acceptance_per_position.png")}
    k = k_advisor(sweeps, folder / "k_advisor.png")
    if k is not None:
        out["k_advisor"] = k
    return out


def speedups(sweep: Sweep) -> dict:
    return {w: speedup_at(sweep.table, w) for w in sweep.workloads}
