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

Evidence (``evidence.py``): every answer carries the successful requests behind it per arm and
step (``basis``) and, where the table has them, 95 % intervals. Steps with fewer than
``min_requests`` successful requests in an arm are left out (and named in a note); when nothing
is left, or the step a verdict rests on has an interval that cannot tell speculation from the
baseline, the answer is ``not_enough_data``. Without interval columns (an old ``steps.csv``) a
step's relative standard error (``*_rse``, from its sub-windows) widens the band within which a
difference counts as "no clear difference" (at least ``MIN_TOL``), as before. A crossover must
*stick*: a dip that is followed by a clear speculation win at a higher step is reported as a
note, not as the crossover.

This module knows no files, HTTP or plotting; ``find_all`` is what the report calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

from spectest.report import evidence as ev
from spectest.report.arm_points import knee, max_goodput, past_saturation, slo_break
from spectest.report.evidence import MIN_REQUESTS_PER_STEP, MIN_TOL, Ratio
from spectest.report.table import SLO
from spectest.report.verdicts import (
    BELOW,
    FLAT_TOL,
    FOUND,
    NO_DATA,
    NO_SLO,
    NOT_ENOUGH,
    NOT_REACHED,
    RISE_TOL,
    BreakPoint,
    _fmt_c,
    _log_interp,
    _n,
    _ok,
)

__all__ = ["BELOW", "FLAT_TOL", "FOUND", "MIN_TOL", "NO_DATA", "NO_SLO", "NOT_ENOUGH",
           "NOT_REACHED", "RISE_TOL", "BreakPoint", "Speedup", "advantage", "crossover",
           "find_all", "first_supported", "knee", "max_goodput", "past_saturation",
           "ratios", "resolution", "slo_break", "speedup_at"]


# --- crossover ------------------------------------------------------------------------------
METRICS = {  # name: (column, higher_is_better, rse column, label)
    "tpot": ("tpot_p50_ms", False, "tpot_p50_rse", "TPOT p50"),
    "throughput": ("output_tokens_per_s", True, "output_tokens_per_s_rse", "output tokens/s"),
}


def ratios(table: pd.DataFrame, workload: str, metric: str, arm: str = "spec",
           baseline: str = "base", min_requests: int = MIN_REQUESTS_PER_STEP) -> list[Ratio]:
    """Speculation's ratio over the baseline (> 1: better) at every step both arms measured."""
    col, higher, rse_col, _ = METRICS[metric]
    t = table[table.workload == workload]
    s = t[t.arm == arm].drop_duplicates("concurrency").set_index("concurrency")
    b = t[t.arm == baseline].drop_duplicates("concurrency").set_index("concurrency")
    out = [ev.ratio(s.loc[c], b.loc[c], col, higher, float(c), min_requests, rse_col)
           for c in sorted(set(s.index) & set(b.index))]
    return [r for r in out if r.value is not None]


def advantage(table: pd.DataFrame, workload: str, metric: str, arm: str = "spec",
              baseline: str = "base", min_requests: int = MIN_REQUESTS_PER_STEP) -> pd.DataFrame:
    """Per concurrency both arms measured: speculation's relative advantage ``a`` and ``tol``.

    a > 0: speculation better (TPOT: base/spec − 1; throughput: spec/base − 1).
    tol = max(MIN_TOL, 2·√(rse_spec² + rse_base²)): the band of "no clear difference" used
    when the table has no intervals; ``low``/``high``: the ratio's 95 % interval (or NaN),
    ``n_spec``/``n_base``: successful requests, ``thin``: under ``min_requests`` in an arm.
    """
    col, higher, _, _ = METRICS[metric]
    t = table[table.workload == workload]
    rows = []
    for r in ratios(table, workload, metric, arm, baseline, min_requests):
        vs = float(t[(t.arm == arm) & (t.concurrency == r.concurrency)][col].iloc[0])
        vb = float(t[(t.arm == baseline) & (t.concurrency == r.concurrency)][col].iloc[0])
        rows.append({"concurrency": r.concurrency, "spec": vs, "base": vb, "a": r.value - 1,
                     "tol": r.tol, "low": r.low, "high": r.high, "n_spec": r.n_spec,
                     "n_base": r.n_base, "thin": r.thin})
    return pd.DataFrame(rows, columns=["concurrency", "spec", "base", "a", "tol", "low", "high",
                                       "n_spec", "n_base", "thin"])


def _thin_note(rs: list[Ratio], min_requests: int) -> tuple[str, ...]:
    thin = [r for r in rs if r.thin]
    if not thin:
        return ()
    return (f"left out for too few requests (under {min_requests} successful per arm): "
            + "; ".join(f"c={_fmt_c(r.concurrency)} ({r.counts()})" for r in thin),)


def _step_basis(r: Ratio) -> str:
    return f"c={_fmt_c(r.concurrency)}: {r.value:.2f}× ({r.evidence()})"


def crossover(table: pd.DataFrame, workload: str, metric: str = "tpot",
              arm: str = "spec", baseline: str = "base",
              min_requests: int = MIN_REQUESTS_PER_STEP) -> BreakPoint:
    """The lowest concurrency from which speculation is no better than the baseline."""
    kind = f"crossover_{metric}"
    label = METRICS[metric][3]
    every = ratios(table, workload, metric, arm, baseline, min_requests)
    adv = advantage(table, workload, metric, arm, baseline, min_requests)
    if not every:
        return BreakPoint(kind, workload, None, NO_DATA, None,
                          evidence=f"no concurrency with both arms measured ({label})")
    use = [r for r in every if not r.thin]
    thin_note = _thin_note(every, min_requests)
    if not use:
        basis = "; ".join(f"c={_fmt_c(r.concurrency)}: {r.evidence()}" for r in every)
        return BreakPoint(kind, workload, None, NOT_ENOUGH, None, every[0].concurrency,
                          every[-1].concurrency,
                          evidence=f"no step has {min_requests} successful requests in both "
                                   f"arms ({label})", basis=basis)
    cs = [r.concurrency for r in use]
    a = [r.value - 1 for r in use]
    vals = adv.set_index("concurrency")

    def show(i: int) -> str:
        return (f"c={_fmt_c(cs[i])}: spec {_n(vals.spec[cs[i]])} vs base "
                f"{_n(vals.base[cs[i]])} ({a[i]:+.1%}; {use[i].evidence()})")

    def ahead_later(i: int) -> bool:
        return any(use[k].judgement == ev.AHEAD for k in range(i + 1, len(use)))

    j = next((i for i in range(len(use)) if a[i] <= 0 and not ahead_later(i)), None)
    notes = thin_note + tuple(
        f"speculation dipped to no better at c={_fmt_c(cs[i])} ({a[i]:+.1%}) but was clearly "
        f"ahead again at a higher step (noise?)"
        for i in range(len(cs) if j is None else j) if a[i] <= 0)
    rests = [len(use) - 1] if j is None else [0] if j == 0 else [j - 1, j]
    basis = "; ".join(_step_basis(use[i]) for i in rests)
    unclear = [use[i] for i in rests if use[i].judgement == ev.UNRESOLVED]
    if unclear:
        return BreakPoint(kind, workload, None, NOT_ENOUGH, None, cs[0], cs[-1],
                          evidence=f"{label}: the interval at "
                                   f"{', '.join(f'c={_fmt_c(r.concurrency)}' for r in unclear)}"
                                   f" cannot tell speculation from the baseline; "
                                   + "; ".join(show(i) for i in rests),
                          notes=notes, basis=basis)
    if j is None:
        last = len(cs) - 1
        close = (" — within noise at the highest step"
                 if use[last].judgement != ev.AHEAD else "")
        return BreakPoint(kind, workload, None, NOT_REACHED, None, cs[0], cs[last],
                          evidence=f"speculation ahead on {label} at every step up to "
                                   f"c={_fmt_c(cs[last])}; {show(last)}{close}", notes=notes,
                          basis=basis)
    lowest = "the lowest step" + (" with enough data" if thin_note else "")
    if j == 0:
        return BreakPoint(kind, workload, None, BELOW, cs[0], cs[0], cs[0],
                          evidence=f"speculation no better on {label} already at {lowest}; "
                                   f"{show(0)}", notes=notes, basis=basis)
    c = _log_interp(cs[j - 1], cs[j], a[j - 1], a[j], 0.0)
    return BreakPoint(kind, workload, None, FOUND, c, cs[j - 1], cs[j],
                      evidence=f"{label}: {show(j - 1)}; {show(j)}; "
                               f"interpolated zero at c≈{_fmt_c(c)}", notes=notes, basis=basis)


@dataclass(frozen=True)
class Speedup:
    workload: str
    concurrency: float | None
    tpot: float | None  # base TPOT p50 / spec TPOT p50
    throughput: float | None  # spec tokens/s / base tokens/s
    e2el: float | None  # base E2EL p50 / spec E2EL p50
    acceptance_rate: float | None
    mean_accepted_length: float | None
    tpot_ratio: Ratio | None = None  # the TPOT speedup with its requests and interval
    throughput_ratio: Ratio | None = None

    @property
    def enough(self) -> bool:
        """The TPOT speedup (the headline) rests on enough requests and tells itself from
        1.0× (the throughput ratio says for itself whether it does)."""
        return self.tpot_ratio is not None and self.tpot_ratio.resolved


def speedup_at(table: pd.DataFrame, workload: str, concurrency: float | None = 1,
               arm: str = "spec", baseline: str = "base",
               min_requests: int = MIN_REQUESTS_PER_STEP) -> Speedup:
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
    tpot, tput = (ev.ratio(rs, rb, col, higher, float(c), min_requests, rse)
                  for col, higher, rse, _ in METRICS.values())
    return Speedup(workload, float(c), ratio(rb.tpot_p50_ms, rs.tpot_p50_ms),
                   ratio(rs.output_tokens_per_s, rb.output_tokens_per_s),
                   ratio(rb.e2el_p50_ms, rs.e2el_p50_ms),
                   float(rs.acceptance_rate) if _ok(rs.acceptance_rate) else None,
                   float(rs.mean_accepted_length) if _ok(rs.mean_accepted_length) else None,
                   tpot if tpot.value is not None else None,
                   tput if tput.value is not None else None)


def first_supported(table: pd.DataFrame, workload: str,
                    min_requests: int = MIN_REQUESTS_PER_STEP) -> Speedup | None:
    """The speedup at the lowest step both arms ran whose TPOT speedup rests on enough requests
    and tells itself from 1.0× (``Speedup.enough``), or None."""
    t = table[table.workload == workload]
    cs = sorted(set(t[t.arm == "spec"].concurrency) & set(t[t.arm == "base"].concurrency))
    for c in cs:
        s = speedup_at(table, workload, c, min_requests=min_requests)
        if s.enough:
            return s
    return None


def find_all(table: pd.DataFrame, slo: SLO, workloads: list[str] | None = None,
             arms: tuple[str, ...] = ("spec", "base"),
             min_requests: int = MIN_REQUESTS_PER_STEP) -> list[BreakPoint]:
    """Every break point of every workload: crossovers, then per arm SLO, knee, max goodput."""
    out: list[BreakPoint] = []
    m = min_requests
    for w in workloads or list(dict.fromkeys(table.workload)):
        out += [crossover(table, w, "tpot", min_requests=m),
                crossover(table, w, "throughput", min_requests=m)]
        for arm in arms:
            if ((table.workload == w) & (table.arm == arm)).any():
                out += [slo_break(table, w, arm, slo, m), knee(table, w, arm, min_requests=m),
                        max_goodput(table, w, arm, min_requests=m)]
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
