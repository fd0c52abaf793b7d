"""A break point as the report states it, and the small helpers every detector shares.

``BreakPoint`` is one answer (crossover, SLO break, knee, max goodput) with its status, the
measured steps that bracket it, its evidence and ``basis`` — the successful requests and the
intervals it rests on (``evidence.py``). Statuses: ``found``, ``below_range`` (at or under the
lowest step), ``not_reached`` (beyond the highest), ``no_data``, ``no_slo`` and
``not_enough_data`` (too few requests, or an interval that cannot tell the arms apart). The
detectors live in ``breakpoints`` (crossovers, speedup) and ``arm_points`` (per arm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

FLAT_TOL = 0.10  # throughput growing by less than this over a step counts as flat
RISE_TOL = 0.10  # latency growing by more than this over the flat part counts as rising

FOUND, BELOW, NOT_REACHED, NO_DATA, NO_SLO, NOT_ENOUGH = (
    "found", "below_range", "not_reached", "no_data", "no_slo", "not_enough_data")
P99_MIN = 100  # a p99 of fewer requests is about the slowest one


@dataclass(frozen=True)
class BreakPoint:
    kind: str  # crossover_tpot | crossover_throughput | slo | knee | max_goodput
    workload: str
    arm: str | None  # None for the crossovers (they compare the arms)
    status: str  # found | below_range | not_reached | no_data | no_slo | not_enough_data
    concurrency: float | None  # interpolated (found), the lowest step (below_range) or None
    lower: float | None = None  # the measured steps that bracket it
    upper: float | None = None
    metric: float | None = None  # goodput (max_goodput), throughput (knee)
    evidence: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    basis: str = ""  # the requests (and intervals) the answer rests on, per arm and step
    interval: tuple[float, float] | None = None  # of ``metric`` (max goodput, knee plateau)

    def summary(self) -> str:
        """The headline with what it rests on: "≈ 5.3 (between 4 and 8) — c=4: …"."""
        if self.status in (NOT_ENOUGH, NO_DATA, NO_SLO) or not self.basis:
            return self.headline()
        return f"{self.headline()} — {self.basis}"

    def headline(self) -> str:
        """A short cell for a table: "≈ 5.3 (4–8)", "≤ 1", "not reached (≤ 8)"."""
        if self.status == NOT_ENOUGH:
            return f"not enough data ({self.basis})" if self.basis else "not enough data"
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




def _series(table: pd.DataFrame, workload: str, arm: str) -> pd.DataFrame:
    t = table[(table.workload == workload) & (table.arm == arm)]
    return t.sort_values("concurrency").reset_index(drop=True)
