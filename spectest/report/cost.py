"""Cost per million output tokens and a capacity plan, per workload and arm: pure functions.

"Is speculation worth it for us?" is a cost question. From the step table (``table.py``), the
SLOs, and the user's prices and target load (``CostInputs``), per workload and arm:

* at every measured concurrency, **goodput tokens/s** — output tokens generated inside the
  measured window by requests that met every per-request SLO (``goodput_tokens_per_s``; an old
  ``steps.csv`` without it: output tokens/s × SLO attainment, flagged as an estimate) — and
  **cost per 1M output tokens** = price per hour ÷ (goodput tokens/s × 3600) × 1e6. Without a
  price the same figure is given in replica-hours per 1M tokens (the cost at 1 per hour);
* an **operating point** is a step that meets every step SLO (``SLO.violations``), has at
  least ``min_requests`` successful requests and some goodput; the **cheapest** is the one with
  the lowest cost per token (the best measured step, so slightly optimistic: winner's curse);
* **replicas** for the target load = ceil(target ÷ per-replica goodput at the cheapest point)
  — goodput req/s for ``target_rps``, goodput tokens/s for ``target_output_tps`` — with the
  range the goodput interval allows; one replica = the measured server, scale-out linear;
* the **saving** from speculation = 1 − (spec cost per token ÷ base cost per token) at each
  arm's cheapest point, with its 95 % interval (``evidence``: the two goodput intervals
  combined on the log scale) and the requests behind it.

It knows no files, HTTP or plotting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from spectest.report import evidence as ev
from spectest.report.evidence import MIN_REQUESTS_PER_STEP, Ratio
from spectest.report.table import SLO

TOKENS = 1e6  # costs are per this many output tokens


@dataclass(frozen=True)
class CostInputs:
    """Prices per replica-hour (the speculative arm may cost more: a draft model needs memory)
    and the load to plan for (requests/s or output tokens/s), all optional."""

    price_per_hour: float | None = None
    spec_price_per_hour: float | None = None  # None: same as price_per_hour
    target_rps: float | None = None
    target_output_tps: float | None = None

    @property
    def priced(self) -> bool:
        return bool(self.price_per_hour)

    def price(self, arm: str) -> float | None:
        if arm.startswith("spec") and self.spec_price_per_hour:
            return float(self.spec_price_per_hour)
        return float(self.price_per_hour) if self.price_per_hour else None

    def to_json(self) -> dict:
        return {"price_per_hour": self.price_per_hour,
                "spec_price_per_hour": self.spec_price_per_hour,
                "target_rps": self.target_rps, "target_output_tps": self.target_output_tps}

    @classmethod
    def from_json(cls, data: dict | None) -> CostInputs:
        data = data or {}
        return cls(*(data.get(k) for k in ("price_per_hour", "spec_price_per_hour",
                                           "target_rps", "target_output_tps")))

    def merged(self, other: CostInputs) -> CostInputs:
        """``other``'s set fields over this one's (command-line flags over the sweep's)."""
        mine, theirs = self.to_json(), other.to_json()
        return CostInputs.from_json({k: theirs[k] if theirs[k] is not None else mine[k]
                                     for k in mine})


@dataclass(frozen=True)
class Point:
    """One measured step of one arm, as a place to run the service."""

    workload: str
    arm: str
    concurrency: float
    n: int | None  # successful requests
    goodput_tps: float | None  # SLO-meeting output tokens/s per replica
    goodput_rps: float | None  # SLO-meeting requests/s per replica
    log_se: float | None  # of goodput_tps (bootstrap over requests)
    rse: float | None  # of throughput across sub-windows (the noise band of an old table)
    duration_s: float | None
    misses: tuple[str, ...]  # step SLOs broken
    thin: bool  # under min_requests successful requests
    estimated: bool  # goodput tokens estimated from throughput × SLO attainment
    price: float | None  # per replica-hour; None: figures in replica-hours
    z: float = ev.Z  # the critical value of the step's intervals (``evidence.step_z``)

    @property
    def usable(self) -> bool:
        return not self.thin and not self.misses and bool(self.goodput_tps)

    @property
    def cost(self) -> float | None:
        """Per 1M output tokens: price/h ÷ (goodput tokens/s × 3600) × 1e6 (or replica-hours)."""
        if not self.goodput_tps or self.goodput_tps <= 0:
            return None
        return (self.price or 1.0) * TOKENS / (self.goodput_tps * 3600)

    @property
    def cost_interval(self) -> tuple[float, float] | None:
        band = ev.log_interval(1.0, self.log_se, self.z) if self.cost else None
        return (self.cost / band[1], self.cost / band[0]) if band else None

    def why_not(self) -> str:
        if self.thin:
            return f"too few requests (n = {self.n})"
        if self.misses:
            return "misses " + ", ".join(m.replace("_ms", "").replace("_", " ")
                                         for m in self.misses)
        if not self.goodput_tps:
            return "no goodput"
        return ""


@dataclass(frozen=True)
class Plan:
    """Per workload and arm: every point, the cheapest and the replicas for the target."""

    workload: str
    arm: str
    points: tuple[Point, ...]
    cheapest: Point | None
    replicas: int | None
    replicas_range: tuple[int, int] | None  # what the goodput interval allows
    fleet_per_hour: float | None  # replicas × price

    @property
    def reason(self) -> str:
        """Why there is no cheapest point."""
        if self.cheapest is not None:
            return ""
        if not self.points:
            return "no step measured"
        if all(p.thin for p in self.points):
            return "not enough data: every step has too few requests"
        return "no operating point meets the SLOs" + (
            " (steps with too few requests excluded)" if any(p.thin for p in self.points)
            else "")


@dataclass(frozen=True)
class Saving:
    """Speculation's cost per token against the baseline's, each at its cheapest point."""

    workload: str
    ratio: Ratio  # base cost ÷ spec cost (> 1: speculation cheaper), with requests+interval
    spec: Point
    base: Point
    fleet_saving_per_hour: float | None  # base fleet − spec fleet, at the target load
    replicas: tuple[int | None, int | None] = (None, None)  # spec, base at the target load

    @property
    def saving(self) -> float:
        """1 − spec cost ÷ base cost (negative: a loss)."""
        return 1 - 1 / self.ratio.value

    @property
    def interval(self) -> tuple[float, float] | None:
        if not self.ratio.has_interval:
            return None
        return 1 - 1 / self.ratio.low, 1 - 1 / self.ratio.high


def _goodput(row) -> tuple[float | None, bool]:
    g = row.get("goodput_tokens_per_s")
    if ev.finite(g):
        return float(g), False
    tps, att = row.get("output_tokens_per_s"), row.get("slo_attainment")
    if ev.finite(tps) and ev.finite(att):
        return float(tps) * float(att), True
    return None, False


def points(table: pd.DataFrame, workload: str, arm: str, slo: SLO, inputs: CostInputs,
           min_requests: int = MIN_REQUESTS_PER_STEP) -> list[Point]:
    t = table[(table.workload == workload) & (table.arm == arm)].sort_values("concurrency")
    out = []
    for row in t.to_dict("records"):
        g, estimated = _goodput(row)
        n = ev.successful(row)
        rps = row.get("goodput_rps")
        se, rse = row.get("goodput_tokens_per_s_log_se"), row.get("output_tokens_per_s_rse")
        out.append(Point(workload, arm, float(row["concurrency"]), n, g,
                         float(rps) if ev.finite(rps) else None,
                         float(se) if ev.finite(se) and not estimated else None,
                         float(rse) if ev.finite(rse) else None,
                         float(row["duration_s"]) if ev.finite(row.get("duration_s")) else None,
                         tuple(slo.violations(row)), ev.thin(n, min_requests), estimated,
                         inputs.price(arm), ev.step_z(row)))
    return out


def _replicas(target: float, per_replica: float | None) -> int | None:
    if not per_replica or per_replica <= 0:
        return None
    return max(1, math.ceil(target / per_replica - 1e-9))


def plan(table: pd.DataFrame, workload: str, arm: str, slo: SLO, inputs: CostInputs,
         min_requests: int = MIN_REQUESTS_PER_STEP) -> Plan:
    pts = tuple(points(table, workload, arm, slo, inputs, min_requests))
    ok = [p for p in pts if p.usable]
    if not ok:
        return Plan(workload, arm, pts, None, None, None, None)
    best = min(ok, key=lambda p: p.cost)
    replicas = span = None
    if inputs.target_output_tps:
        replicas = _replicas(inputs.target_output_tps, best.goodput_tps)
        band = ev.log_interval(best.goodput_tps, best.log_se, best.z)
        if band:
            span = (_replicas(inputs.target_output_tps, band[1]),
                    _replicas(inputs.target_output_tps, band[0]))
    elif inputs.target_rps:
        replicas = _replicas(inputs.target_rps, best.goodput_rps)
        band = (ev.poisson_rate_interval(best.goodput_rps * best.duration_s, best.duration_s)
                if best.goodput_rps and best.duration_s else None)
        if band and band[0] > 0:
            span = (_replicas(inputs.target_rps, band[1]), _replicas(inputs.target_rps, band[0]))
    fleet = replicas * best.price if replicas is not None and best.price else None
    return Plan(workload, arm, pts, best, replicas, span, fleet)


def saving(spec: Plan, base: Plan,
           min_requests: int = MIN_REQUESTS_PER_STEP) -> Saving | None:
    """Spec against base at their cheapest points; None unless both have one."""
    if spec.cheapest is None or base.cheapest is None:
        return None
    s, b = spec.cheapest, base.cheapest
    value = b.cost / s.cost  # both priced, or both in replica-hours
    low = high = None
    why = ev.NO_COLUMNS
    if s.log_se is not None and b.log_se is not None:
        half = max(s.z, b.z) * math.hypot(s.log_se, b.log_se)
        low, high = value * math.exp(-half), value * math.exp(half)
    elif s.estimated or b.estimated:
        why = "interval unavailable: goodput tokens estimated from an old steps.csv"
    tol = max(ev.MIN_TOL, 2 * math.hypot(s.rse or 0.0, b.rse or 0.0))  # used without interval
    ratio = Ratio(s.concurrency, value, low, high, s.n, b.n, min_requests, tol, why)
    fleet = (base.fleet_per_hour - spec.fleet_per_hour
             if base.fleet_per_hour is not None and spec.fleet_per_hour is not None else None)
    return Saving(spec.workload, ratio, s, b, fleet, (spec.replicas, base.replicas))


@dataclass(frozen=True)
class WorkloadCost:
    workload: str
    plans: dict[str, Plan]  # arm → plan
    saving: Saving | None


def analyse(table: pd.DataFrame, slo: SLO, inputs: CostInputs, workloads: list[str],
            min_requests: int = MIN_REQUESTS_PER_STEP,
            arms: tuple[str, ...] = ("spec", "base")) -> list[WorkloadCost]:
    out = []
    for w in workloads:
        plans = {arm: plan(table, w, arm, slo, inputs, min_requests) for arm in arms
                 if ((table.workload == w) & (table.arm == arm)).any()}
        sv = (saving(plans["spec"], plans["base"], min_requests)
              if {"spec", "base"} <= set(plans) else None)
        out.append(WorkloadCost(w, plans, sv))
    return out


def assumptions(inputs: CostInputs, slo: SLO, min_requests: int,
                estimated: bool = False) -> list[str]:
    """The assumptions to print next to the figures."""
    if inputs.priced:
        spec = inputs.price("spec")
        price = (f"price {inputs.price_per_hour:g} per replica-hour (baseline)"
                 + (f", {spec:g} with speculation" if spec != inputs.price_per_hour else
                    ", the same with speculation"))
    else:
        price = ("no price given: costs are in replica-hours per 1M output tokens (the cost at "
                 "1 per hour); pass --price-per-hour (and --spec-price-per-hour when the "
                 "speculative deployment costs more) for money")
    if inputs.target_output_tps:
        target = f"target load {inputs.target_output_tps:g} output tokens/s"
    elif inputs.target_rps:
        target = f"target load {inputs.target_rps:g} requests/s"
    else:
        target = "no target load: pass --target-rps or --target-output-tps for replica counts"
    out = [price, target,
           f"SLOs: {slo.describe()}; an operating point is a step meeting every one of them",
           "throughput counted: goodput tokens — output tokens generated in the measured "
           "window by requests that met every per-request SLO",
           "one replica = the measured server; linear scale-out assumed (no router or "
           "batching gains across replicas)",
           f"steps with fewer than {min_requests} successful requests are excluded",
           "the cheapest point is the best measured step: a slightly optimistic pick"]
    if estimated:
        out.append("this steps.csv predates goodput tokens: estimated as output tokens/s × "
                   "SLO attainment, without an interval")
    return out
