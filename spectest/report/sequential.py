"""Decisive steps: how long the arms of a sweep step run, without breaking the stated 95 %.

A step is measured in *looks*. Each look runs every arm once more (``--step-time`` measured
seconds after its warm-up); after it the step's ratios of speculation over the baseline — TPOT
p50 and output tokens/s, over all its looks so far — are judged (``evidence.Ratio``). The step
stops at the first look at which both are **settled** — ahead, behind or even, never thin or
unresolved — or at the cap the user set, ``--max-step-time`` (``looks_for``: L looks).

Looking again after an unsettled look is optional stopping: at a fixed z = 1.96 per look the
chance that some look's interval misses the true ratio grows with every look, and a step would
stop exactly when noise made it look decided. Repeated confidence intervals (Jennison and
Turnbull, *Group Sequential Methods*, ch. 9) with Lan–DeMets alpha spending keep the rate:

* look k of L sits at information fraction t_k = k / L (equal looks; the measured time is the
  information, as requests arrive at a steady rate within a step);
* the Pocock-type spending function α(t) = α · ln(1 + (e − 1) · t) says how much of the
  α = 0.05 may be spent by t — much of it early, so a clear step stops at its first look;
* the critical values c_1 … c_L solve P(|Z_j| < c_j for every j ≤ k) = 1 − α(t_k), where Z_j
  is the standardised estimate at look j of a Brownian motion (corr(Z_i, Z_j) = √(t_i / t_j)),
  computed once per L with ``scipy.stats.multivariate_normal``.

Every interval of look k is r · exp(± c_k · se). The chance that *any* look's interval misses
the true ratio is then at most α, so whichever look a step stops at — for whatever reason —
its interval covers the true ratio at least 95 % of the time and its verdict (ahead, behind,
even) is wrong at most 5 % of the time. A step with one look (L = 1) has c_1 = 1.96: nothing
changes for it. ``tests/report/test_report_sequential.py`` checks both claims by simulating
closed loops with known ratios.

This module is arithmetic and judgement only; ``sweep.run`` runs the looks and
``evidence.ratio`` takes the critical value from the rows' ``interval_z``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from spectest.report import evidence as ev

ALPHA = 1 - ev.CONFIDENCE
MAX_LOOKS = 12
METRICS = {  # the ratios a step must settle: column, higher is better
    "tpot": ("tpot_p50_ms", False),
    "throughput": ("output_tokens_per_s", True),
}
SETTLED, CAP = "settled", "cap"


def spent(t: float, alpha: float = ALPHA) -> float:
    """The Pocock-type spending function: α spent by information fraction t (0 ≤ t ≤ 1)."""
    t = min(1.0, max(0.0, t))
    return alpha * math.log(1 + (math.e - 1) * t)


@lru_cache(maxsize=64)
def critical_values(looks: int, alpha: float = ALPHA) -> tuple[float, ...]:
    """c_1 … c_L for L equally spaced looks (repeated confidence intervals, two-sided).

    Computed by propagating the density of the score process S_k = Z_k·√t_k (independent
    normal increments of variance 1/L) on a fine grid, with the paths that crossed an earlier
    boundary removed (Armitage, McPherson and Rowe's recursion); c_k is then the root of
    P(inside up to k) = 1 − α(t_k)."""
    import numpy as np
    from scipy import optimize, signal, stats

    if not 1 <= looks <= MAX_LOOKS:
        raise ValueError(f"looks must be 1..{MAX_LOOKS}, got {looks}")
    t = [(k + 1) / looks for k in range(looks)]
    h = 0.0005
    grid = np.arange(-8.0, 8.0 + h / 2, h)  # the score's range: |S| ≤ 8 SDs of S_L
    step_sd = math.sqrt(1 / looks)
    offsets = np.arange(-int(8 * step_sd / h), int(8 * step_sd / h) + 1) * h
    kernel = stats.norm.pdf(offsets, scale=step_sd) * h
    density = stats.norm.pdf(grid, scale=math.sqrt(t[0]))
    out = [float(stats.norm.ppf(1 - spent(t[0], alpha) / 2))]
    for k in range(1, looks):
        edge = out[-1] * math.sqrt(t[k - 1])
        # the paths still inside after look k: the density, cut at ±edge (the edge cells by
        # the share of them inside)
        weight = np.clip((edge - np.abs(grid)) / h + 0.5, 0.0, 1.0)
        density = signal.fftconvolve(density * weight, kernel, mode="same")
        mass = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * h)])
        goal = 1 - spent(t[k], alpha)

        def inside(c: float, k: int = k) -> float:
            b = c * math.sqrt(t[k])
            return float(np.interp(b, grid, mass) - np.interp(-b, grid, mass)) - goal
        out.append(float(optimize.brentq(inside, 0.5, 6.0, xtol=1e-7)))
    return tuple(out)


def looks_for(step_time_s: float, max_step_time_s: float | None) -> int:
    """How many looks a step may take: the cap over one look's measured time (at least 1)."""
    if not max_step_time_s or max_step_time_s <= step_time_s:
        return 1
    return max(1, min(MAX_LOOKS, int(max_step_time_s / step_time_s + 1e-9)))


def z_at(look: int, looks: int) -> float:
    """The critical value of look ``look`` (1-based) of ``looks``."""
    return critical_values(looks)[min(look, looks) - 1]


@dataclass(frozen=True)
class Look:
    """A step after look ``k`` of ``looks``: its ratios at that look's critical value."""

    k: int
    looks: int
    z: float
    ratios: dict  # metric → evidence.Ratio

    @property
    def settled(self) -> bool:
        return bool(self.ratios) and all(r.resolved for r in self.ratios.values())

    @property
    def final(self) -> bool:
        return self.settled or self.k >= self.looks

    @property
    def status(self) -> str:
        return SETTLED if self.settled else CAP

    def text(self) -> str:
        """'look 2/3 (z = 2.30): tpot 1.45× [1.30–1.62] ahead, throughput … → settled'."""
        parts = ", ".join(f"{m} {_short(r)}" for m, r in self.ratios.items())
        then = ("settled" if self.settled else "time cap reached" if self.k >= self.looks
                else "not settled: another look")
        return f"look {self.k}/{self.looks} (z = {self.z:.2f}): {parts} → {then}"


WORDS = {ev.THIN: "too few requests", ev.UNRESOLVED: "unclear"}


def _short(r: ev.Ratio) -> str:
    if r.value is None:
        return "no data"
    band = f" [{r.low:.2f}–{r.high:.2f}]" if r.has_interval else ""
    return f"{r.value:.2f}×{band} {WORDS.get(r.judgement, r.judgement)}"


def judge(spec_row, base_row, k: int, looks: int, concurrency: float,
          min_requests: int = ev.MIN_REQUESTS_PER_STEP) -> Look:
    """The step's ratios after look ``k`` of ``looks`` (rows pooled over the looks so far)."""
    z = z_at(k, looks)
    ratios = {m: ev.ratio(spec_row, base_row, col, higher, concurrency, min_requests, z=z)
              for m, (col, higher) in METRICS.items()}
    return Look(k, looks, z, ratios)


def method_text(looks: int, step_time_s: float | None) -> str:
    """One paragraph for the report's setup: how steps were made decisive."""
    if looks <= 1:
        return ("**Decisive steps.** Each step was measured once (`--max-step-time` not above "
                "`--step-time`): its intervals use z = 1.96.")
    zs = ", ".join(f"{z:.2f}" for z in critical_values(looks))
    each = f"{step_time_s:g} s" if step_time_s else "one step time"
    return (f"**Decisive steps.** A step ran look after look — every arm {each} more each "
            f"time — until both its ratios (TPOT p50 and output tokens/s) were settled "
            f"(ahead, behind or even), or up to {looks} looks (`--max-step-time`). So that "
            f"stopping when the data look decided does not break the stated 95 %, the "
            f"intervals are repeated confidence intervals with Lan–DeMets alpha spending "
            f"(Pocock type, α·ln(1 + (e − 1)·k/{looks})): z at looks 1…{looks} = {zs}. The "
            f"chance that any look's interval misses the true ratio is at most "
            f"{ALPHA:.0%}, so a verdict is wrong at most {ALPHA:.0%} of the time whichever "
            f"look it stopped at. The table's `decided` column says which steps settled and "
            f"which reached the cap.")
