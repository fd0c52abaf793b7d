"""Break points of a concurrency sweep, each with its evidence: pure functions over the step table.

Four questions, per workload (see ``table.py`` for the columns):

* **speculation crossover** — the lowest concurrency at which speculation's TPOT p50 (and,
  separately, its output throughput) is no better than the baseline's;
* **SLO break point** — the highest concurrency meeting every SLO, per arm;
* **saturation knee** — where throughput stops growing while latency keeps rising, per arm;
* **max goodput** — the best SLO-meeting request rate measured, per arm.

Concurrency steps are usually geometric (1, 2, 4, 8), so a point between two measured steps is
interpolated linearly in log2(concurrency); every answer names the two measured steps that
bracket it. A point that the measured range does not contain is reported as ``not_reached``
(or ``below_range`` when it lies at or under the lowest step) — never invented.

Noise: a step's relative standard error (``*_rse`` columns, from its sub-windows) widens the
band within which a difference counts as "no clear difference" (at least ``MIN_TOL``). A
crossover must *stick*: a dip that is followed by a clear speculation win at a higher step is
reported as a note, not as the crossover.

This module knows no files, HTTP or plotting; ``find_all`` is what the report calls.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from spectest.report.table import SLO

MIN_TOL = 0.03  # differences under 3 % are never "clear", whatever the measured noise
FLAT_TOL = 0.10  # throughput growing by less than this over a step counts as flat
RISE_TOL = 0.10  # latency growing by more than this over the flat part counts as rising

FOUND, BELOW, NOT_REACHED, NO_DATA, NO_SLO = (
    "found", "below_range", "not_reached", "no_data", "no_slo")


@dataclass(frozen=True)
class BreakPoint:
    kind: str  # crossover_tpot | crossover_throughput | slo | knee | max_goodput
    workload: str
    arm: str | None  # None for the crossovers (they compare the arms)
    status: str  # found | below_range | not_reached | no_data | no_slo
    concurrency: float | None  # interpolated (found), the lowest step (below_range) or None
    lower: float | None = None  # the measured steps that bracket it
    upper: float | None = None
    metric: float | None = None  # goodput (max_goodput), throughput (knee)
    evidence: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def headline(self) -> str:
        """A short cell for a table: "≈ 5.3 (4–8)", "≤ 1", "not reached (≤ 8)"."""
        if self.status == FOUND:
            if self.lower is not None and self.upper is not None and self.lower != self.upper:
                return f"≈ {_fmt_c(self.concurrency)} (between {_fmt_c(self.lower)} " \
                       f"and {_fmt_c(self.upper)})"
            return f"{_fmt_c(self.concurrency)}"
        if self.status == BELOW and self.kind == "slo":
            return f"none (missed at c={_fmt_c(self.concurrency)}, the lowest step)"
        if self.status == BELOW:
            return f"≤ {_fmt_c(self.concurrency)} (lowest step)"
        if self.status == NOT_REACHED:
            return f"not reached (up to {_fmt_c(self.upper)})" if self.upper else "not reached"
        if self.status == NO_SLO:
            return "no SLO set"
        return "no data"


def _fmt_c(c: float | None) -> str:
    if c is None or not math.isfinite(c):
        return "-"
    return f"{c:.0f}" if abs(c - round(c)) < 0.05 else f"{c:.1f}"


def _n(x: float) -> str:
    """A measured figure for evidence text: 4 significant digits, no exponent."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _log_interp(c0: float, c1: float, y0: float, y1: float, target: float) -> float:
    """The concurrency between c0 and c1 where y (linear in log2 c) reaches ``target``."""
    if y1 == y0:
        return c1
    f = min(1.0, max(0.0, (target - y0) / (y1 - y0)))
    return float(2 ** (math.log2(c0) + f * (math.log2(c1) - math.log2(c0))))


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and np.isfinite(v)


def _rse(row, col: str) -> float:
    v = row.get(col) if hasattr(row, "get") else None
    return float(v) if _ok(v) else 0.0


# --- crossover ------------------------------------------------------------------------------
METRICS = {  # name: (column, higher_is_better, rse column, label)
    "tpot": ("tpot_p50_ms", False, "tpot_p50_rse", "TPOT p50"),
    "throughput": ("output_tokens_per_s", True, "output_tokens_per_s_rse", "output tokens/s"),
}


def advantage(table: pd.DataFrame, workload: str, metric: str, arm: str = "spec",
              baseline: str = "base") -> pd.DataFrame:
    """Per concurrency both arms measured: speculation's relative advantage ``a`` and ``tol``.

    a > 0: speculation better (TPOT: base/spec − 1; throughput: spec/base − 1).
    tol = max(MIN_TOL, 2·√(rse_spec² + rse_base²)): the band of "no clear difference".
    """
    col, higher, rse_col, _ = METRICS[metric]
    t = table[table.workload == workload]
    s = t[t.arm == arm].set_index("concurrency")
    b = t[t.arm == baseline].set_index("concurrency")
    rows = []
    for c in sorted(set(s.index) & set(b.index)):
        vs, vb = s.at[c, col], b.at[c, col]
        if not (_ok(vs) and _ok(vb)) or vs <= 0 or vb <= 0:
            continue
        a = vs / vb - 1 if higher else vb / vs - 1
        noise = 2 * math.hypot(_rse(s.loc[c], rse_col), _rse(b.loc[c], rse_col))
        rows.append({"concurrency": float(c), "spec": float(vs), "base": float(vb),
                     "a": float(a), "tol": max(MIN_TOL, noise)})
    return pd.DataFrame(rows, columns=["concurrency", "spec", "base", "a", "tol"])


def crossover(table: pd.DataFrame, workload: str, metric: str = "tpot",
              arm: str = "spec", baseline: str = "base") -> BreakPoint:
    """The lowest concurrency from which speculation is no better than the baseline."""
    kind = f"crossover_{metric}"
    label = METRICS[metric][3]
    adv = advantage(table, workload, metric, arm, baseline)
    if adv.empty:
        return BreakPoint(kind, workload, None, NO_DATA, None,
                          evidence=f"no concurrency with both arms measured ({label})")
    cs, a, tol = adv.concurrency.tolist(), adv.a.tolist(), adv.tol.tolist()

    def show(i: int) -> str:
        return (f"c={_fmt_c(cs[i])}: spec {_n(adv.spec[i])} vs base {_n(adv.base[i])} "
                f"({a[i]:+.1%})")

    j = next((i for i in range(len(cs))
              if a[i] <= 0 and all(a[k] <= tol[k] for k in range(i + 1, len(cs)))), None)
    notes = tuple(f"speculation dipped to no better at c={_fmt_c(cs[i])} ({a[i]:+.1%}) but "
                  f"was clearly ahead again at a higher step (noise?)"
                  for i in range(len(cs) if j is None else j) if a[i] <= 0)
    if j is None:
        last = len(cs) - 1
        close = (" — within noise at the highest step" if a[last] <= tol[last] else "")
        return BreakPoint(kind, workload, None, NOT_REACHED, None, cs[0], cs[last],
                          evidence=f"speculation ahead on {label} at every step up to "
                                   f"c={_fmt_c(cs[last])}; {show(last)}{close}", notes=notes)
    if j == 0:
        return BreakPoint(kind, workload, None, BELOW, cs[0], cs[0], cs[0],
                          evidence=f"speculation no better on {label} already at the lowest "
                                   f"step; {show(0)}", notes=notes)
    c = _log_interp(cs[j - 1], cs[j], a[j - 1], a[j], 0.0)
    return BreakPoint(kind, workload, None, FOUND, c, cs[j - 1], cs[j],
                      evidence=f"{label}: {show(j - 1)}; {show(j)}; "
                               f"interpolated zero at c≈{_fmt_c(c)}", notes=notes)


# --- SLO break point ------------------------------------------------------------------------
def slo_break(table: pd.DataFrame, workload: str, arm: str, slo: SLO) -> BreakPoint:
    """The highest concurrency meeting every SLO (interpolated towards the first miss)."""
    s = _series(table, workload, arm)
    if not slo.any:
        return BreakPoint("slo", workload, arm, NO_SLO, None, evidence="no SLO was set")
    if s.empty:
        return BreakPoint("slo", workload, arm, NO_DATA, None, evidence="no steps measured")
    rows = s.to_dict("records")
    misses = [slo.violations(r) for r in rows]
    cs = [float(r["concurrency"]) for r in rows]
    j = next((i for i, m in enumerate(misses) if m), None)
    if j is None:
        return BreakPoint("slo", workload, arm, NOT_REACHED, None, cs[0], cs[-1],
                          evidence=f"every SLO ({slo.describe()}) met at every step up to "
                                   f"c={_fmt_c(cs[-1])}")
    what = "; ".join(_miss(rows[j], m, slo) for m in misses[j])
    later = [cs[i] for i in range(j + 1, len(rows)) if not misses[i]]
    notes = ((f"met again at c={', '.join(_fmt_c(c) for c in later)} (noise?)",)
             if later else ())
    if j == 0:
        return BreakPoint("slo", workload, arm, BELOW, cs[0], cs[0], cs[0],
                          evidence=f"SLO missed already at the lowest step c={_fmt_c(cs[0])}: "
                                   f"{what}", notes=notes)
    lo, hi = rows[j - 1], rows[j]
    limits = {**slo.thresholds, "error_rate": slo.max_error_rate}
    crossings = []
    for m in misses[j]:
        y0, y1 = lo.get(m), hi.get(m)
        if _ok(y0) and _ok(y1) and y1 > y0:
            crossings.append(_log_interp(cs[j - 1], cs[j], float(y0), float(y1), limits[m]))
        else:  # no figure at the miss (e.g. nothing succeeded): the step itself bounds it
            crossings.append(cs[j - 1])
    c = min(crossings)
    return BreakPoint("slo", workload, arm, FOUND, c, cs[j - 1], cs[j],
                      evidence=f"all SLOs met at c={_fmt_c(cs[j - 1])}; at c={_fmt_c(cs[j])} "
                               f"{what}", notes=notes)


def _miss(row: dict, col: str, slo: SLO) -> str:
    if col == "error_rate":
        return f"error rate {float(row[col]):.1%} > {slo.max_error_rate:.0%}"
    v = row.get(col)
    shown = f"{_n(float(v))} ms" if _ok(v) else "no successful request"
    return f"{col.replace('_ms', '').replace('_', ' ')} {shown} > {slo.thresholds[col]:g} ms"


# --- saturation knee ------------------------------------------------------------------------
def knee(table: pd.DataFrame, workload: str, arm: str, flat_tol: float = FLAT_TOL,
         rise_tol: float = RISE_TOL, latency: str = "e2el_p50_ms") -> BreakPoint:
    """Where throughput stops growing while latency keeps rising.

    The plateau starts at the first step i (not the last) after which no step's throughput
    exceeds step i's by more than ``flat_tol`` while latency at the last step is more than
    ``rise_tol`` above step i's. The knee is interpolated between step i−1 and step i where
    throughput reaches the plateau's maximum / (1 + flat_tol).
    """
    s = _series(table, workload, arm)
    s = s[s.output_tokens_per_s.notna() & (s.output_tokens_per_s > 0)]
    if len(s) < 2:
        return BreakPoint("knee", workload, arm, NO_DATA if s.empty else NOT_REACHED, None,
                          upper=float(s.concurrency.iloc[-1]) if len(s) else None,
                          evidence="fewer than two steps with throughput")
    cs = s.concurrency.astype(float).tolist()
    tp = s.output_tokens_per_s.astype(float).tolist()
    lat = s[latency].astype(float).tolist()
    notes = []
    for i in range(len(cs) - 1):
        flat = all(tp[k] <= (1 + flat_tol) * tp[i] for k in range(i + 1, len(cs)))
        if not flat:
            continue
        rising = _ok(lat[i]) and _ok(lat[-1]) and lat[-1] > (1 + rise_tol) * lat[i]
        if not rising:
            notes.append(f"throughput flat from c={_fmt_c(cs[i])} but latency not rising "
                         f"(client-bound?)")
            continue
        plateau = max(tp[i:])
        evidence = (f"throughput {_n(tp[i])} tok/s at c={_fmt_c(cs[i])} and at most "
                    f"{_n(max(tp[i + 1:]))} beyond (≤ +{flat_tol:.0%}), while "
                    f"{latency.replace('_ms', '').replace('_', ' ')} rose "
                    f"{_n(lat[i])} → {_n(lat[-1])} ms by c={_fmt_c(cs[-1])}")
        if i == 0:
            return BreakPoint("knee", workload, arm, BELOW, cs[0], cs[0], cs[0], plateau,
                              evidence=evidence, notes=tuple(notes))
        c = _log_interp(cs[i - 1], cs[i], tp[i - 1], tp[i], plateau / (1 + flat_tol))
        return BreakPoint("knee", workload, arm, FOUND, c, cs[i - 1], cs[i], plateau,
                          evidence=evidence, notes=tuple(notes))
    growth = tp[-1] / tp[-2] - 1
    return BreakPoint("knee", workload, arm, NOT_REACHED, None, cs[0], cs[-1], max(tp),
                      evidence=f"throughput still growing at the highest step "
                               f"({growth:+.0%} from c={_fmt_c(cs[-2])} to c={_fmt_c(cs[-1])})",
                      notes=tuple(notes))


def past_saturation(series: pd.DataFrame, patience: int = 2, flat_tol: float = FLAT_TOL,
                    rise_tol: float = RISE_TOL, latency: str = "e2el_p50_ms") -> str | None:
    """Why a running series may stop, or None.

    "Clearly past saturation": at least ``patience + 2`` steps measured (a curve, not a
    couple of noisy points), ``patience`` of them beyond the knee, and latency at the last
    step at least double the knee step's while throughput stayed flat.
    """
    if len(series) < patience + 2:
        return None
    workload, arm = series.workload.iloc[0], series.arm.iloc[0]
    bp = knee(series, workload, arm, flat_tol, rise_tol, latency)
    if bp.status not in (FOUND, BELOW):
        return None
    s = series.sort_values("concurrency")
    beyond = s[s.concurrency > bp.upper]
    at_knee = s[s.concurrency == bp.upper][latency]
    if len(beyond) < patience or at_knee.empty:
        return None
    if not float(beyond[latency].iloc[-1]) >= 2 * float(at_knee.iloc[0]):
        return None
    return (f"past saturation: knee ≈ c={_fmt_c(bp.concurrency)}, {len(beyond)} steps beyond "
            f"it with flat throughput and latency at least doubled ({bp.evidence})")


# --- goodput and speedup --------------------------------------------------------------------
def max_goodput(table: pd.DataFrame, workload: str, arm: str,
                flat_tol: float = FLAT_TOL) -> BreakPoint:
    s = _series(table, workload, arm)
    s = s[s.goodput_rps.notna()]
    if s.empty:
        return BreakPoint("max_goodput", workload, arm, NO_DATA, None,
                          evidence="no step with goodput")
    i = int(np.argmax(s.goodput_rps.to_numpy()))
    c, g = float(s.concurrency.iloc[i]), float(s.goodput_rps.iloc[i])
    notes = ()
    if i == len(s) - 1 and len(s) > 1 and g > (1 + flat_tol) * float(s.goodput_rps.iloc[-2]):
        notes = ("still rising at the highest step: a higher load may give more",)
    return BreakPoint("max_goodput", workload, arm, FOUND, c, c, c, g,
                      evidence=f"{g:.3g} req/s meeting every SLO at c={_fmt_c(c)}", notes=notes)


@dataclass(frozen=True)
class Speedup:
    workload: str
    concurrency: float | None
    tpot: float | None  # base TPOT p50 / spec TPOT p50
    throughput: float | None  # spec tokens/s / base tokens/s
    e2el: float | None  # base E2EL p50 / spec E2EL p50
    acceptance_rate: float | None
    mean_accepted_length: float | None


def speedup_at(table: pd.DataFrame, workload: str, concurrency: float | None = 1,
               arm: str = "spec", baseline: str = "base") -> Speedup:
    """Measured speedup at ``concurrency`` (default 1; the lowest common step if absent)."""
    t = table[table.workload == workload]
    s, b = t[t.arm == arm].set_index("concurrency"), t[t.arm == baseline].set_index("concurrency")
    common = sorted(set(s.index) & set(b.index))
    if not common:
        return Speedup(workload, None, None, None, None, None, None)
    c = concurrency if concurrency in common else common[0]
    rs, rb = s.loc[c], b.loc[c]

    def ratio(num, den):
        return float(num) / float(den) if _ok(num) and _ok(den) and float(den) > 0 else None
    return Speedup(workload, float(c), ratio(rb.tpot_p50_ms, rs.tpot_p50_ms),
                   ratio(rs.output_tokens_per_s, rb.output_tokens_per_s),
                   ratio(rb.e2el_p50_ms, rs.e2el_p50_ms),
                   float(rs.acceptance_rate) if _ok(rs.acceptance_rate) else None,
                   float(rs.mean_accepted_length) if _ok(rs.mean_accepted_length) else None)


def _series(table: pd.DataFrame, workload: str, arm: str) -> pd.DataFrame:
    t = table[(table.workload == workload) & (table.arm == arm)]
    return t.sort_values("concurrency").reset_index(drop=True)


def find_all(table: pd.DataFrame, slo: SLO, workloads: list[str] | None = None,
             arms: tuple[str, ...] = ("spec", "base")) -> list[BreakPoint]:
    """Every break point of every workload: crossovers, then per arm SLO, knee, max goodput."""
    out: list[BreakPoint] = []
    for w in workloads or list(dict.fromkeys(table.workload)):
        out += [crossover(table, w, "tpot"), crossover(table, w, "throughput")]
        for arm in arms:
            if ((table.workload == w) & (table.arm == arm)).any():
                out += [slo_break(table, w, arm, slo), knee(table, w, arm),
                        max_goodput(table, w, arm)]
    return out


def resolution(table: pd.DataFrame) -> str:
    """One sentence on the step resolution of the sweep."""
    cs = sorted({float(c) for c in table.concurrency.dropna()})
    if not cs:
        return "no steps measured"
    shown = ", ".join(_fmt_c(c) for c in cs)
    ratios = {round(b / a, 2) for a, b in itertools.pairwise(cs)}
    kind = "doubling" if ratios == {2.0} else "explicit steps"
    return (f"concurrency steps {shown} ({kind}); points between steps are interpolated "
            f"linearly in log2(concurrency), so each lies somewhere between the two measured "
            f"steps named beside it")
