"""From verdict to configuration: the speculation schedule the measured crossovers imply.

A sweep says, per workload and concurrency, whether speculation is ahead of the baseline. A
server takes its speculation knob per *batch size* — the requests it runs in one step — not
per client concurrency, so this module

* places the switch where the crossover is (``breakpoints.crossover``: TPOT p50, output
  tokens/s, or both, ``--objective``): speculation on below it, off from it; on everywhere when
  it was not reached (the last range then carries K beyond the highest step, unmeasured), off
  everywhere when speculation was no better even at the lowest step. A crossover the data do
  not place (not enough data) leaves the schedule resting on the other, marked provisional;
  with neither placed there is no schedule;
* maps that concurrency to a batch size with the server's own running-requests gauge, measured
  at the two steps that bracket the crossover (``running_mean``; interpolated in log2 like the
  crossover itself) — or, where the server has no such gauge, says it took batch =
  concurrency;
* writes it as inclusive batch-size ranges with a K each (``Schedule.ranges``; K is the draft
  length the sweep ran, 0 = off), per workload and for a traffic mix the user describes
  (``--mix chat=0.6,code=0.4``: each step's ratios are the mix-weighted geometric mean of the
  workloads', their log variances added with squared weights);
* and words it in each server's own flags (``render``), from the flavour table's ``knobs``:
  vLLM's ``num_speculative_tokens_per_batch_size``, SGLang's adaptive ladder, llama-server's
  draft settings, spectest's ``--disable-above``.

Every schedule says what it rests on — the crossover's steps, n and intervals — and what it
cannot know. Pure functions over the step table; ``sections`` words the report around them and
``sweep.run`` runs the spectest form as the verification arm.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from spectest import flavours
from spectest.report import breakpoints as bpm
from spectest.report import evidence as ev
from spectest.report.advisor import k_run
from spectest.report.verdicts import _fmt_c

OBJECTIVES = ("both", "tpot", "throughput")
MIX = "mix"
ON, OFF, ALWAYS, NONE = "schedule", "off", "always", "no schedule"


class MixError(ValueError):
    """A ``--mix`` that cannot be read; one line for the user."""


def parse_mix(text: str, workloads: list[str] | None = None) -> dict[str, float]:
    """``chat=0.6,code=0.4`` → weights summing to 1 ({} for empty text)."""
    if not text or not text.strip():
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        try:
            w = float(weight)
        except ValueError:
            raise MixError(f"--mix wants workload=weight pairs like chat=0.6,code=0.4, got "
                           f"{part.strip()!r}") from None
        if not name or not math.isfinite(w) or w < 0:
            raise MixError(f"--mix weights must be workload=non-negative number, got "
                           f"{part.strip()!r}")
        out[name.strip()] = out.get(name.strip(), 0.0) + w
    if workloads is not None:
        unknown = [w for w in out if w not in workloads]
        if unknown:
            raise MixError(f"--mix names {', '.join(unknown)}, which the sweep did not measure "
                           f"(it has {', '.join(workloads)})")
    total = sum(out.values())
    if total <= 0:
        raise MixError("--mix weights add up to 0")
    return {w: v / total for w, v in out.items() if v > 0}


def mix_table(table: pd.DataFrame, weights: dict[str, float]) -> pd.DataFrame:
    """Pseudo-rows of workload ``mix``: per arm and step both arms ran for every workload of the
    mix, the weighted geometric mean of each figure (so the arms' ratio is the weighted
    geometric mean of the workloads' ratios), its log standard error √Σ w²·se², the requests
    summed and the running gauge weighted."""
    rows = []
    t = table[table.workload.isin(list(weights))]
    for (arm, c), g in t.groupby(["arm", "concurrency"]):
        if set(g.workload) != set(weights):
            continue  # a step some workload of the mix lacks
        row: dict = {"workload": MIX, "arm": arm, "concurrency": c}
        w = np.array([weights[x] for x in g.workload])
        for col in ("tpot_p50_ms", "output_tokens_per_s", "goodput_tokens_per_s"):
            v = pd.to_numeric(g[col], errors="coerce").to_numpy(dtype=float)
            row[col] = float(np.exp((w * np.log(v)).sum())) if (v > 0).all() else None
            se = pd.to_numeric(g.get(ev.log_se_column(col)), errors="coerce")
            se = se.to_numpy(dtype=float) if se is not None else np.full(len(g), np.nan)
            row[ev.log_se_column(col)] = (float(np.sqrt((w * w * se * se).sum()))
                                          if np.isfinite(se).all() else None)
        for col in ("requests", "failures"):
            row[col] = float(pd.to_numeric(g[col], errors="coerce").fillna(0).sum())
        for col in ("running_mean", "running_min", "running_max", "k", "interval_z"):
            v = pd.to_numeric(g.get(col), errors="coerce")
            v = v.to_numpy(dtype=float) if v is not None else np.array([np.nan])
            ok = np.isfinite(v)
            if col == "interval_z":
                row[col] = float(v[ok].max()) if ok.any() else None
            elif col in ("running_min", "running_max"):
                row[col] = float((v[ok].min() if col == "running_min" else v[ok].max())) \
                    if ok.any() else None
            else:
                row[col] = float((w[ok] * v[ok]).sum() / w[ok].sum()) if ok.any() else None
        for col in ("drafts", "draft_tokens"):
            row[col] = float(pd.to_numeric(g.get(col), errors="coerce").fillna(0).sum())
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Step:
    """One measured concurrency as the schedule sees it."""

    concurrency: float
    batch: float | None  # the server's mean running requests (speculative arm), None: no gauge
    batch_low: float | None
    batch_high: float | None
    k: int  # what the schedule runs at this step's batch
    ratios: dict  # metric → evidence.Ratio


@dataclass(frozen=True)
class Schedule:
    name: str  # a workload, or "mix"
    status: str  # schedule (on, then off) | always | off | no schedule
    k: int | None  # the draft length the sweep ran (what "on" means)
    ranges: tuple[tuple[int, int, int], ...]  # inclusive batch-size ranges, K each
    cutoff_concurrency: float | None = None  # where speculation stops paying
    cutoff_batch: float | None = None  # the same as a batch size
    crossovers: tuple[bpm.BreakPoint, ...] = ()
    steps: tuple[Step, ...] = ()
    mapping: str = ""  # how concurrency became batch size
    weights: dict = field(default_factory=dict)  # the mix (mix only)
    why: str = ""  # the crossover it follows, or why there is none

    @property
    def last_on(self) -> int | None:
        """The largest batch size that still speculates (None: none does, or no schedule)."""
        on = [r[1] for r in self.ranges if r[2] > 0]
        return max(on) if on else None

    def k_at(self, batch: float) -> int | None:
        """The K this schedule runs at a batch size (the last range carries on)."""
        if not self.ranges:
            return None
        b = max(1, int(round(batch)))
        for first, last, k in self.ranges:
            if first <= b <= last:
                return k
        return self.ranges[-1][2]

    def boundaries(self) -> list[float]:
        """Batch sizes between two ranges of different K (first of the new range − ½)."""
        return [b[0] - 0.5 for a, b in zip(self.ranges, self.ranges[1:]) if a[2] != b[2]]

    def basis(self) -> str:
        """What it rests on: the crossovers' steps, n and intervals."""
        return "; ".join(f"{_metric(bp)}: {bp.summary()}" for bp in self.crossovers)

    @classmethod
    def from_json(cls, d: dict) -> Schedule:
        """A schedule as ``to_json`` wrote it (the ranges and what they rest on, no steps)."""
        return cls(name=str(d["name"]), status=str(d["status"]), k=d.get("k"),
                   ranges=tuple(tuple(int(x) for x in r) for r in d.get("ranges") or ()),
                   cutoff_concurrency=d.get("cutoff_concurrency"),
                   cutoff_batch=d.get("cutoff_batch"), mapping=d.get("mapping") or "",
                   weights=d.get("weights") or {}, why=d.get("why") or "")

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "k": self.k,
                "ranges": [list(r) for r in self.ranges],
                "cutoff_concurrency": self.cutoff_concurrency,
                "cutoff_batch": self.cutoff_batch, "last_on": self.last_on,
                "mapping": self.mapping, "weights": self.weights, "why": self.why,
                "basis": self.basis(),
                "steps": [{"concurrency": s.concurrency, "batch": s.batch,
                           "batch_low": s.batch_low, "batch_high": s.batch_high, "k": s.k,
                           **{f"{m}_ratio": r.value for m, r in s.ratios.items()},
                           **{f"{m}_judgement": r.judgement for m, r in s.ratios.items()}}
                          for s in self.steps]}


def _gauge(t: pd.DataFrame, c: float) -> tuple[float | None, float | None, float | None]:
    """(mean, min, max) of the running gauge at step c: the speculative arm's, else any arm's."""
    for arm in ("spec", "base", "spec-advised"):
        r = t[(t.arm == arm) & (t.concurrency == c)]
        if len(r) and ev.finite(r.iloc[0].get("running_mean")):
            row = r.iloc[0]
            return tuple(float(row[x]) if ev.finite(row.get(x)) else None
                         for x in ("running_mean", "running_min", "running_max"))
    return None, None, None


def _metric(bp: bpm.BreakPoint) -> str:
    return {"crossover_tpot": "TPOT", "crossover_throughput": "throughput"}.get(bp.kind, bp.kind)


def _batch_at(t: pd.DataFrame, c: float, lower: float | None, upper: float | None) -> float:
    """The batch size at concurrency c: the gauge interpolated in log2 between the steps that
    bracket it (c itself where a step has no gauge)."""
    if lower is None or upper is None or lower == upper:
        b = _gauge(t, lower if lower is not None else c)[0]
        return b if b is not None else c
    b0 = _gauge(t, lower)[0]
    b1 = _gauge(t, upper)[0]
    b0 = lower if b0 is None or b0 <= 0 else b0
    b1 = upper if b1 is None or b1 <= 0 else b1
    f = max(0.0, min(1.0, (math.log2(c) - math.log2(lower))
                     / (math.log2(upper) - math.log2(lower))))
    return float(2 ** (math.log2(b0) + f * (math.log2(b1) - math.log2(b0))))


def build(table: pd.DataFrame, name: str, objective: str = "both",
          min_requests: int = ev.MIN_REQUESTS_PER_STEP,
          weights: dict | None = None) -> Schedule:
    """The schedule of one workload (or of ``mix_table`` rows named ``mix``)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}")
    t = table[table.workload == name]
    metrics = ("tpot", "throughput") if objective == "both" else (objective,)
    cross = tuple(bpm.crossover(table, name, m, min_requests=min_requests) for m in metrics)
    k = k_run(table, name) if {"k", "drafts"} & set(t.columns) else None
    steps_c = sorted(set(t[t.arm == "spec"].concurrency) & set(t[t.arm == "base"].concurrency))
    top = int(max(steps_c)) if steps_c else 1
    has_gauge = any(_gauge(t, c)[0] is not None for c in steps_c)
    mapping = ("batch sizes from the server's running-requests gauge, sampled every second "
               "during each step" if has_gauge else
               "no running-requests gauge on this server: batch size taken as the "
               "concurrency, which overstates it when requests wait or are between turns")
    base = dict(name=name, k=k, crossovers=cross, mapping=mapping, weights=weights or {})
    unusable = [bp for bp in cross if bp.status in (bpm.NOT_ENOUGH, bpm.NO_DATA)]
    usable = tuple(bp for bp in cross if bp not in unusable)
    if not steps_c or not usable or not k:
        why = ("the speculative arm's K is unknown" if not k and usable else
               "; ".join(f"{_metric(bp)}: {bp.headline()}" for bp in unusable)
               or "no step with both arms")
        return Schedule(status=NONE, ranges=(), why=f"no schedule: {why}", **base)
    # a crossover the data do not place leaves the schedule resting on the other: said so
    provisional = "".join(f"; provisional, the {_metric(bp)} crossover is unplaced: "
                          f"{bp.headline()}" for bp in unusable)
    offs = [(bp.concurrency if bp.status == bpm.FOUND else steps_c[0], bp) for bp in usable
            if bp.status in (bpm.FOUND, bpm.BELOW)]
    if not offs:
        ranges = ((1, top, k),)
        status, cut_c, cut_b, why = ALWAYS, None, None, (
            f"speculation still paid at the highest step (c={top}) on "
            + " and ".join(_metric(bp) for bp in usable)
            + f": K = {k} at every batch size; beyond c={top} it was not measured")
    else:
        cut_c, first = min(offs, key=lambda x: x[0])
        if first.status == bpm.BELOW:
            ranges, status, cut_b = ((1, top, 0),), OFF, None
            why = (f"speculation was no better already at the lowest step "
                   f"({_metric(first)}): off at every batch size")
        else:
            cut_b = _batch_at(t, cut_c, first.lower, first.upper)
            last = math.floor(cut_b)
            if last < 1:
                ranges, status = ((1, top, 0),), OFF
            else:
                ranges = ((1, last, k), (last + 1, max(last + 1, top), 0))
                status = ON
            why = (f"the {_metric(first)} crossover at c ≈ "
                   f"{_fmt_c(cut_c)} (between {_fmt_c(first.lower)} and {_fmt_c(first.upper)})"
                   f" is batch ≈ {cut_b:.1f}: K = {k} up to batch {last}, off above")
    why += provisional
    steps = []
    ratio_sets = {m: {r.concurrency: r for r in bpm.ratios(table, name, m,
                                                           min_requests=min_requests)}
                  for m in ("tpot", "throughput")}
    sched = Schedule(status=status, ranges=ranges, cutoff_concurrency=cut_c,
                     cutoff_batch=cut_b, why=why, **base)
    for c in steps_c:
        mean, low, high = _gauge(t, c)
        steps.append(Step(float(c), mean, low, high,
                          int(sched.k_at(mean if mean is not None else c) or 0),
                          {m: rs[c] for m, rs in ratio_sets.items() if c in rs}))
    return Schedule(status=status, ranges=ranges, cutoff_concurrency=cut_c,
                    cutoff_batch=cut_b, steps=tuple(steps), why=why, **base)


def build_all(table: pd.DataFrame, workloads: list[str], objective: str = "both",
              min_requests: int = ev.MIN_REQUESTS_PER_STEP,
              mix: dict[str, float] | None = None) -> list[Schedule]:
    """One schedule per workload, then the mix's (the given mix, else equal weights)."""
    pairs = table[table.arm.isin(["spec", "base"])]
    out = [build(pairs, w, objective, min_requests) for w in workloads]
    if len(workloads) > 1 or mix:
        weights = mix or {w: 1 / len(workloads) for w in workloads}
        rows = mix_table(pairs, weights)
        if not rows.empty:
            out.append(build(pd.concat([pairs, rows], ignore_index=True), MIX, objective,
                             min_requests, weights))
    return out


# --- in each server's words ---------------------------------------------------------------
def _ranges(schedule: Schedule, form: str) -> str:
    if form == "lower-bounds":  # SGLang's ladder: a range's first batch size → its steps
        return json.dumps({str(first): {"candidate_steps": [k]}
                           for first, _, k in schedule.ranges})
    return json.dumps([list(r) for r in schedule.ranges])


def config_head(speculative_config: str | dict | None) -> str:
    """The start of a vLLM ``--speculative-config`` JSON object, the schedule's keys left out:
    the user's own method fields, or placeholders."""
    cfg = speculative_config
    if isinstance(cfg, str) and cfg.strip():
        try:
            cfg = json.loads(cfg)
        except json.JSONDecodeError:
            cfg = None
    if not isinstance(cfg, dict):
        return '{"method": "…", '
    keep = {k: v for k, v in cfg.items()
            if k not in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")}
    body = json.dumps(keep)[1:-1]
    return "{" + (body + ", " if body else "")


def render(schedule: Schedule, flavour: flavours.Flavour,
           speculative_config: str | dict | None = None) -> str:
    """The schedule in ``flavour``'s own flags (one line), or why it has none."""
    kn = flavour.knobs
    if schedule.status == NONE or not schedule.k:
        return "no change: the sweep does not place a crossover to schedule from"
    k_max = max(r[2] for r in schedule.ranges)
    fill = {"k": schedule.k, "k_max": max(k_max, 1), "k_max_plus_1": max(k_max, 1) + 1,
            "last": schedule.last_on or 0, "config_head": config_head(speculative_config)}
    if schedule.status == OFF:
        return kn.off or "turn speculation off"
    if schedule.status == ALWAYS:
        return kn.always.format(**fill) if kn.always else "keep speculation on"
    if kn.per_batch:
        return kn.per_batch.format(ranges=_ranges(schedule, kn.ranges_form), **fill)
    if kn.cutoff:
        return kn.cutoff.format(**fill)
    return kn.always.format(**fill) + f" if its batch stays at or under {fill['last']}, " \
                                      f"else {kn.off}"


def vllm_schedule(schedule: Schedule) -> list[list[int]] | None:
    """The ``num_speculative_tokens_per_batch_size`` value of a schedule (None: none)."""
    if schedule.status == NONE or not schedule.ranges:
        return None
    return [list(r) for r in schedule.ranges]


def spectest_serve_args(schedule: Schedule) -> list[str] | None:
    """``spectest serve`` flags that run ``schedule`` (the verification arm), or None."""
    if schedule.status == NONE or not schedule.k:
        return None
    if schedule.status == OFF:
        return ["--k", str(schedule.k), "--disable-above", "0"]
    if schedule.status == ALWAYS:
        return ["--k", str(schedule.k)]
    return ["--k", str(schedule.k), "--disable-above", str(schedule.last_on)]
