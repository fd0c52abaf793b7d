"""Per-arm break points: the SLO break point, the saturation knee and the best goodput.

Pure functions over the step table (see ``table.py``), each answer a ``BreakPoint`` carrying
the successful requests per step it rests on. Steps with fewer than ``min_requests`` successful
requests are left out and named in a note; with none left the answer is ``not_enough_data``.
A p99 from fewer than ``P99_MIN`` requests is flagged: it is about the slowest request. Max
goodput carries an exact Poisson interval on its count of SLO-meeting requests; a knee, the
bootstrap interval of its plateau throughput where the table has one. ``past_saturation`` is
the running sweep's early-stop test (a control decision, so every step counts there).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spectest.report import evidence as ev
from spectest.report.evidence import MIN_REQUESTS_PER_STEP
from spectest.report.table import SLO
from spectest.report.verdicts import (
    BELOW,
    FLAT_TOL,
    FOUND,
    NO_DATA,
    NO_SLO,
    NOT_ENOUGH,
    NOT_REACHED,
    P99_MIN,
    RISE_TOL,
    BreakPoint,
    _fmt_c,
    _log_interp,
    _n,
    _ok,
    _series,
)


# --- per-arm evidence -----------------------------------------------------------------------
def _arm_steps(table: pd.DataFrame, workload: str, arm: str,
               min_requests: int) -> tuple[pd.DataFrame, tuple[str, ...], str]:
    """(steps with enough requests, note on those left out, basis when none is left)."""
    s = _series(table, workload, arm)
    n = [ev.successful(r) for r in s.to_dict("records")]
    thin = [ev.thin(x, min_requests) for x in n]
    if not any(thin):
        return s, (), ""
    left = "; ".join(f"c={_fmt_c(c)} (n = {x})" for c, x, t in zip(s.concurrency, n, thin) if t)
    note = (f"left out for too few requests (under {min_requests} successful): {left}",)
    keep = s[[not t for t in thin]].reset_index(drop=True)
    return keep, note, ("" if len(keep) else f"every step under {min_requests} successful "
                                             f"requests: {left}")


def _n_at(rows: list[dict], p99: bool = False) -> str:
    """'n = 28 at c=4, 30 at c=8' (+ a warning when a p99 rests on under 100 requests)."""
    ns = [(ev.successful(r), r["concurrency"]) for r in rows]
    text = "n = " + ", ".join(f"{'?' if x is None else x} at c={_fmt_c(float(c))}"
                              for x, c in ns)
    if p99 and any(x is not None and x < P99_MIN for x, _ in ns):
        text += f" (a p99 of under {P99_MIN} requests is about the slowest one)"
    return text


def _n_range(rows: list[dict]) -> str:
    ns = [x for x in (ev.successful(r) for r in rows) if x is not None]
    if not ns:
        return "n = ? per step"
    lo, hi = min(ns), max(ns)
    return f"n = {lo} per step" if lo == hi else f"n = {lo}–{hi} per step"


# --- SLO break point ------------------------------------------------------------------------
def slo_break(table: pd.DataFrame, workload: str, arm: str, slo: SLO,
              min_requests: int = MIN_REQUESTS_PER_STEP) -> BreakPoint:
    """The highest concurrency meeting every SLO (interpolated towards the first miss)."""
    if not slo.any:
        return BreakPoint("slo", workload, arm, NO_SLO, None, evidence="no SLO was set")
    if _series(table, workload, arm).empty:
        return BreakPoint("slo", workload, arm, NO_DATA, None, evidence="no steps measured")
    s, left, none_left = _arm_steps(table, workload, arm, min_requests)
    if s.empty:
        return BreakPoint("slo", workload, arm, NOT_ENOUGH, None, evidence=none_left,
                          basis=none_left.split(": ", 1)[1])
    rows = s.to_dict("records")
    misses = [slo.violations(r) for r in rows]
    cs = [float(r["concurrency"]) for r in rows]
    j = next((i for i, m in enumerate(misses) if m), None)
    if j is None:
        return BreakPoint("slo", workload, arm, NOT_REACHED, None, cs[0], cs[-1],
                          evidence=f"every SLO ({slo.describe()}) met at every step up to "
                                   f"c={_fmt_c(cs[-1])}", notes=left,
                          basis=f"{_n_range(rows)}; highest: {_n_at(rows[-1:], True)}")
    what = "; ".join(_miss(rows[j], m, slo) for m in misses[j])
    later = [cs[i] for i in range(j + 1, len(rows)) if not misses[i]]
    notes = left + ((f"met again at c={', '.join(_fmt_c(c) for c in later)} (noise?)",)
                    if later else ())
    if j == 0:
        return BreakPoint("slo", workload, arm, BELOW, cs[0], cs[0], cs[0],
                          evidence=f"SLO missed already at the lowest step c={_fmt_c(cs[0])}: "
                                   f"{what}", notes=notes, basis=_n_at(rows[:1], True))
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
                               f"{what}", notes=notes, basis=_n_at([lo, hi], True))


def _miss(row: dict, col: str, slo: SLO) -> str:
    if col == "error_rate":
        return f"error rate {float(row[col]):.1%} > {slo.max_error_rate:.0%}"
    v = row.get(col)
    shown = f"{_n(float(v))} ms" if _ok(v) else "no successful request"
    return f"{col.replace('_ms', '').replace('_', ' ')} {shown} > {slo.thresholds[col]:g} ms"


# --- saturation knee ------------------------------------------------------------------------
def knee(table: pd.DataFrame, workload: str, arm: str, flat_tol: float = FLAT_TOL,
         rise_tol: float = RISE_TOL, latency: str = "e2el_p50_ms",
         min_requests: int = MIN_REQUESTS_PER_STEP) -> BreakPoint:
    """Where throughput stops growing while latency keeps rising.

    The plateau starts at the first step i (not the last) after which no step's throughput
    exceeds step i's by more than ``flat_tol`` while latency at the last step is more than
    ``rise_tol`` above step i's. The knee is interpolated between step i−1 and step i where
    throughput reaches the plateau's maximum / (1 + flat_tol). Steps with fewer than
    ``min_requests`` successful requests are left out (0: keep every step).
    """
    every = _series(table, workload, arm)
    every = every[every.output_tokens_per_s.notna() & (every.output_tokens_per_s > 0)]
    s, left, none_left = _arm_steps(every, workload, arm, min_requests)
    if len(every) and s.empty:
        return BreakPoint("knee", workload, arm, NOT_ENOUGH, None, evidence=none_left,
                          basis=none_left.split(": ", 1)[1])
    if len(s) < 2:
        return BreakPoint("knee", workload, arm, NO_DATA if s.empty else NOT_REACHED, None,
                          upper=float(s.concurrency.iloc[-1]) if len(s) else None,
                          evidence="fewer than two steps with throughput"
                                   + (" and enough requests" if left else ""), notes=left,
                          basis=_n_at(s.to_dict("records")) if len(s) else "")
    rows = s.to_dict("records")
    cs = s.concurrency.astype(float).tolist()
    tp = s.output_tokens_per_s.astype(float).tolist()
    lat = s[latency].astype(float).tolist()
    notes = list(left)
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
        top = rows[i + int(np.argmax(tp[i:]))]
        band = ev.log_interval(plateau, top.get("output_tokens_per_s_log_se"), ev.step_z(top))
        evidence = (f"throughput {_n(tp[i])} tok/s at c={_fmt_c(cs[i])} and at most "
                    f"{_n(max(tp[i + 1:]))} beyond (≤ +{flat_tol:.0%}), while "
                    f"{latency.replace('_ms', '').replace('_', ' ')} rose "
                    f"{_n(lat[i])} → {_n(lat[-1])} ms by c={_fmt_c(cs[-1])}")
        basis = (_n_at(rows[max(0, i - 1):]) + f"; plateau {_n(plateau)} tok/s "
                 + (f"({ev.CONFIDENCE:.0%} interval {_n(band[0])}–{_n(band[1])})" if band
                    else "(interval unavailable)"))
        if i == 0:
            return BreakPoint("knee", workload, arm, BELOW, cs[0], cs[0], cs[0], plateau,
                              evidence=evidence, notes=tuple(notes), basis=basis,
                              interval=band)
        c = _log_interp(cs[i - 1], cs[i], tp[i - 1], tp[i], plateau / (1 + flat_tol))
        return BreakPoint("knee", workload, arm, FOUND, c, cs[i - 1], cs[i], plateau,
                          evidence=evidence, notes=tuple(notes), basis=basis, interval=band)
    growth = tp[-1] / tp[-2] - 1
    return BreakPoint("knee", workload, arm, NOT_REACHED, None, cs[0], cs[-1], max(tp),
                      evidence=f"throughput still growing at the highest step "
                               f"({growth:+.0%} from c={_fmt_c(cs[-2])} to c={_fmt_c(cs[-1])})",
                      notes=tuple(notes), basis=_n_at(rows[-2:]))


def past_saturation(series: pd.DataFrame, patience: int = 2, flat_tol: float = FLAT_TOL,
                    rise_tol: float = RISE_TOL, latency: str = "e2el_p50_ms") -> str | None:
    """Why a running series may stop, or None.

    "Clearly past saturation": at least ``patience + 2`` steps measured (a curve, not a
    couple of noisy points), ``patience`` of them beyond the knee, and latency at the last
    step at least double the knee step's while throughput stayed flat. (A control decision of
    the running sweep, not a stated verdict: every step counts, whatever its request count.)
    """
    if len(series) < patience + 2:
        return None
    workload, arm = series.workload.iloc[0], series.arm.iloc[0]
    bp = knee(series, workload, arm, flat_tol, rise_tol, latency, min_requests=0)
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
def max_goodput(table: pd.DataFrame, workload: str, arm: str, flat_tol: float = FLAT_TOL,
                min_requests: int = MIN_REQUESTS_PER_STEP) -> BreakPoint:
    """The best SLO-meeting request rate measured, with an exact Poisson interval on it."""
    every = _series(table, workload, arm)
    every = every[every.goodput_rps.notna()]
    if every.empty:
        return BreakPoint("max_goodput", workload, arm, NO_DATA, None,
                          evidence="no step with goodput")
    s, left, none_left = _arm_steps(every, workload, arm, min_requests)
    if s.empty:
        return BreakPoint("max_goodput", workload, arm, NOT_ENOUGH, None, evidence=none_left,
                          basis=none_left.split(": ", 1)[1])
    i = int(np.argmax(s.goodput_rps.to_numpy()))
    row = s.iloc[i]
    c, g = float(row.concurrency), float(row.goodput_rps)
    seconds = float(row.duration_s) if _ok(row.get("duration_s")) else float("nan")
    band = ev.poisson_rate_interval(g * seconds, seconds)
    notes = left
    if i == len(s) - 1 and len(s) > 1 and g > (1 + flat_tol) * float(s.goodput_rps.iloc[-2]):
        notes += ("still rising at the highest step: a higher load may give more",)
    shown = (f"{ev.CONFIDENCE:.0%} interval {band[0]:.3g}–{band[1]:.3g} req/s (exact Poisson "
             f"on {round(g * seconds)} SLO-meeting requests)" if band
             else "interval unavailable (no step duration)")
    return BreakPoint("max_goodput", workload, arm, FOUND, c, c, c, g,
                      evidence=f"{g:.3g} req/s meeting every SLO at c={_fmt_c(c)}", notes=notes,
                      basis=f"{_n_at([row.to_dict()])}; {shown}", interval=band)
