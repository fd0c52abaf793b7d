"""The evidence behind a verdict: how many requests, and a 95 % interval.

Every speedup, crossover, break point and cost figure spectest states carries the number of
successful requests behind it (per arm and step) and an interval. This module owns how both are
computed and judged; it knows no files, HTTP or plotting.

**Per step and arm** (at summary time, from the step's ``requests.jsonl``), the standard error
of the log of each figure — the step's ``*_log_se`` columns:

* TPOT p50 (median of per-request TPOT): the successful requests are resampled with
  replacement ``RESAMPLES`` times (``scipy.stats.bootstrap``, seeded, so ``steps.csv`` is
  reproducible) and the median recomputed;
* output tokens/s and goodput tokens/s (tokens generated inside the measured window ÷ window;
  goodput: of requests meeting every SLO): the ratio estimator of a closed loop, tokens over
  the time the requests took, clustered by the requests sent together (``throughput_log_se``).
  Simulated closed loops (``benchmarks/interval_coverage.py``) show it covering at its stated
  rate where resampling the requests of a fixed window — the estimator before it, which also
  added a Poisson term for their number — was four to eight times wider than needed.

**A ratio of the two arms** (speedup, cost ratio): r · exp(± z · √(se_spec² + se_base²)): the
arms are independent samples, so the variances of their logs add. z = Φ⁻¹(0.975) for a step
measured once; a step that was looked at several times before it stopped (``sequential``)
carries its own, larger z in the ``interval_z`` column, which keeps the 95 % under optional
stopping. The interval covers request-to-request variation inside each step; drift of the
machine between the two arms' runs (they run one after the other) is not in it — the per-step
load average is.

**Judgement** of a ratio r (> 1: speculation better) with interval [lo, hi]:

* ``thin`` — either arm has fewer than ``min_requests`` successful requests (default
  ``MIN_REQUESTS_PER_STEP``): no verdict rests on it, whatever its interval;
* ``ahead`` — lo > 1 and r > 1 + MIN_TOL; ``behind`` — hi < 1 and r < 1 / (1 + MIN_TOL);
* ``even`` — otherwise, with the interval inside [1 / (1 + EVEN_TOL), 1 + EVEN_TOL]: the
  measurement rules out a difference that matters either way;
* ``unresolved`` — otherwise: the interval is too wide to tell the ratio from 1.0×.

A table written before the interval columns existed (an old ``steps.csv``) has no interval:
its ratios are judged against the band ±``tol`` from the sub-window spread (``*_rse``: ahead or
behind outside it; inside it even when the band is within ±EVEN_TOL, else unresolved), and
every text says "interval unavailable".
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_REQUESTS_PER_STEP = 20  # successful requests per arm and step below which nothing is said
CONFIDENCE = 0.95
Z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # 1.96 (scipy is imported lazily)
RESAMPLES = 2000
MIN_TOL = 0.03  # differences under 3 % are never "clear", whatever the interval
EVEN_TOL = 0.10  # an interval inside ±10 % of 1.0× says "no difference that matters"
SEED = 0

THIN, AHEAD, BEHIND, EVEN, UNRESOLVED = "thin", "ahead", "behind", "even", "unresolved"
NO_COLUMNS = "interval unavailable"  # an old steps.csv: see ``interval_note``


# --- per step and arm (summary time) --------------------------------------------------------
def bootstrap_log_se(values, statistic: Callable[..., np.ndarray],
                     seed: int = SEED) -> float | None:
    """SD of log(statistic) over bootstrap resamples of ``values``; None under 2 values.

    ``statistic(sample, axis)`` must be vectorised (``np.median``, a scaled ``np.sum``).
    """
    from scipy import stats

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return None
    with warnings.catch_warnings():  # identical values: scipy warns, the spread is simply 0
        warnings.simplefilter("ignore")
        res = stats.bootstrap((v,), statistic, n_resamples=RESAMPLES, vectorized=True,
                              method="percentile", batch=max(1, int(2_000_000 // len(v))),
                              rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, dtype=float)
    dist = dist[np.isfinite(dist) & (dist > 0)]
    if len(dist) < RESAMPLES // 2:
        return None
    return float(np.std(np.log(dist), ddof=1))


def median_log_se(values, seed: int = SEED) -> float | None:
    return bootstrap_log_se(values, lambda x, axis: np.median(x, axis=axis), seed)


def throughput_log_se(tokens, busy_s, concurrency: int = 1) -> float | None:
    """Of a closed loop's throughput: the standard error of its log, from its requests.

    A user of a closed loop sends its next request when the last one ends, so its throughput is
    a ratio — tokens over the time the requests took — and a long request both brings more
    tokens and leaves room for fewer requests (renewal-reward). The ratio estimator
    r = Σ tokens / Σ busy seconds has, by the delta method, var(log r) ≈ Σ (y_i − r·x_i)² /
    (Σ y_i)²; the c requests sent together share the server's rounds, so the residuals are
    summed in clusters of ``concurrency`` consecutive sends first (cluster-robust, G clusters,
    factor G / (G − 1)), and the result is scaled by t_{G−1} / z so that z times it is the
    small-sample 95 % half-width. ``tokens``, ``busy_s``: per request in send order (output
    tokens — or 0 for goodput's misses — and send-to-last-token seconds). None under 2
    clusters or without tokens. ``benchmarks/interval_coverage.py`` measures its coverage
    against the fixed-window bootstrap it replaced (which ignored that correlation and was
    about four times too wide)."""
    from scipy import stats

    y = np.asarray(tokens, dtype=float)
    x = np.asarray(busy_s, dtype=float)
    keep = np.isfinite(y) & np.isfinite(x) & (x > 0)
    y, x = y[keep], x[keep]
    c = max(1, int(concurrency or 1))
    groups = len(y) // c
    if groups < 2 or y.sum() <= 0:
        return None
    r = y.sum() / x.sum()
    residual = (y - r * x)[:groups * c].reshape(groups, c).sum(axis=1)
    used = groups * c  # a last, incomplete cluster is left out of the variance only
    var = float((residual ** 2).sum()) * groups / (groups - 1) * (len(y) / used)
    se = math.sqrt(var) / float(y.sum())
    return se * float(stats.t.ppf(0.5 + CONFIDENCE / 2, groups - 1)) / Z


# --- reading a step row ---------------------------------------------------------------------
def finite(v) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def successful(row) -> int | None:
    """Successful requests of a step row (requests − failures); None when the row lacks them."""
    req, fail = row.get("requests"), row.get("failures")
    if not finite(req):
        return None
    return int(float(req) - (float(fail) if finite(fail) else 0.0))


def thin(n: int | None, min_requests: int) -> bool:
    """Too few requests to say anything (an unknown count is not gated: it is shown as '?')."""
    return n is not None and n < min_requests


def counts(n_spec: int | None, n_base: int | None = None, arms: bool = True,
           labels: tuple[str, str] = ("spec", "base")) -> str:
    def s(n):
        return "?" if n is None else str(n)
    if not arms:
        return f"n = {s(n_spec)}"
    return f"n = {s(n_spec)} {labels[0]} / {s(n_base)} {labels[1]}"


# --- a ratio of the arms --------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    """A ratio of the two arms at one step, oriented so that > 1 means speculation is better."""

    concurrency: float
    value: float | None
    low: float | None
    high: float | None
    n_spec: int | None
    n_base: int | None
    min_requests: int = MIN_REQUESTS_PER_STEP
    tol: float = MIN_TOL  # band of "no clear difference" when there is no interval
    no_interval: str = NO_COLUMNS  # why ``low``/``high`` are missing
    labels: tuple[str, str] = ("spec", "base")  # the two arms, as the counts name them

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def thin(self) -> bool:
        return thin(self.n_spec, self.min_requests) or thin(self.n_base, self.min_requests)

    @property
    def judgement(self) -> str:
        if self.thin or self.value is None:
            return THIN
        r = self.value
        if not self.has_interval:  # old tables: the sub-window band ±tol stands in for it
            if abs(r - 1) > self.tol:
                return AHEAD if r > 1 else BEHIND
            return EVEN if self.tol <= EVEN_TOL else UNRESOLVED
        if self.low > 1 and r > 1 + MIN_TOL:
            return AHEAD
        if self.high < 1 and r < 1 / (1 + MIN_TOL):
            return BEHIND
        if self.low >= 1 / (1 + EVEN_TOL) and self.high <= 1 + EVEN_TOL:
            return EVEN
        return UNRESOLVED

    @property
    def resolved(self) -> bool:
        return self.judgement in (AHEAD, BEHIND, EVEN)

    def counts(self) -> str:
        return counts(self.n_spec, self.n_base, labels=self.labels)

    def interval(self, unit: str = "×") -> str:
        if not self.has_interval:
            band = (f"; sub-window noise ±{self.tol:.0%}"
                    if self.tol > MIN_TOL and not self.no_interval.startswith("no interval")
                    else "")
            return self.no_interval + band
        return f"{CONFIDENCE:.0%} interval {self.low:.2f}{unit}–{self.high:.2f}{unit}"

    def evidence(self) -> str:
        """'n = 40 spec / 38 base; 95% interval 1.10×–1.33×'."""
        return f"{self.counts()}; {self.interval()}"

    def text(self) -> str:
        """'1.21× (n = …; 95% interval …)', or 'not enough data (…)' when no verdict may rest
        on it (too few requests, or an interval that cannot tell the ratio from 1.0×)."""
        if self.value is None:
            return f"no data ({self.counts()})"
        if self.judgement in (THIN, UNRESOLVED):
            return f"not enough data ({self.evidence()}{self.why()})"
        return f"{self.value:.2f}× ({self.evidence()})"

    def why(self) -> str:
        if self.judgement == THIN:
            return f"; fewer than {self.min_requests} successful requests in an arm"
        if self.judgement == UNRESOLVED:
            return "; the interval cannot tell it from 1.0×"
        return ""


def step_z(*rows) -> float:
    """The critical value of the intervals at a step: the largest ``interval_z`` of its rows
    (a step that was looked at several times, ``sequential``), else ``Z``."""
    zs = [float(r.get("interval_z")) for r in rows
          if hasattr(r, "get") and finite(r.get("interval_z"))]
    return max([Z] + zs)


def ratio(spec_row, base_row, col: str, higher_is_better: bool, concurrency: float,
          min_requests: int = MIN_REQUESTS_PER_STEP, rse_col: str | None = None,
          z: float | None = None, labels: tuple[str, str] = ("spec", "base")) -> Ratio:
    """The arms' ratio of ``col`` at one step, with its interval from the ``*_log_se`` columns
    (``z``: the critical value; default the rows' own, ``step_z``)."""
    n_s, n_b = successful(spec_row), successful(base_row)
    vs, vb = spec_row.get(col), base_row.get(col)
    tol = MIN_TOL
    if rse_col:
        rs, rb = (float(r.get(rse_col)) if finite(r.get(rse_col)) else 0.0
                  for r in (spec_row, base_row))
        tol = max(MIN_TOL, 2 * math.hypot(rs, rb))
    if not (finite(vs) and finite(vb)) or float(vs) <= 0 or float(vb) <= 0:
        return Ratio(concurrency, None, None, None, n_s, n_b, min_requests, tol,
                     labels=labels)
    value = float(vs) / float(vb) if higher_is_better else float(vb) / float(vs)
    se_col = log_se_column(col)
    ss, sb = spec_row.get(se_col), base_row.get(se_col)
    if finite(ss) and finite(sb):
        half = (step_z(spec_row, base_row) if z is None else z) * math.hypot(float(ss),
                                                                              float(sb))
        return Ratio(concurrency, value, value * math.exp(-half), value * math.exp(half),
                     n_s, n_b, min_requests, tol, labels=labels)
    few = any(n is not None and n < 2 for n in (n_s, n_b))
    why = "no interval: an arm has fewer than 2 successful requests" if few else NO_COLUMNS
    return Ratio(concurrency, value, None, None, n_s, n_b, min_requests, tol, why, labels)


def log_se_column(col: str) -> str:
    """``tpot_p50_ms`` → ``tpot_p50_log_se``; ``output_tokens_per_s`` → ``…_per_s_log_se``."""
    return (col[:-3] if col.endswith("_ms") else col) + "_log_se"


def log_interval(value: float, log_se, z: float = Z) -> tuple[float, float] | None:
    """value · exp(± z · se): the 95 % interval of one arm's figure."""
    if not finite(log_se):
        return None
    half = z * float(log_se)
    return value * math.exp(-half), value * math.exp(half)


def poisson_rate_interval(count: float, seconds: float) -> tuple[float, float] | None:
    """Exact (Garwood) 95 % interval of a rate from ``count`` events in ``seconds``.

    Used for request rates (goodput in req/s): a closed loop's completions are less variable
    than Poisson arrivals, so this interval is, if anything, too wide.
    """
    from scipy import stats

    if not finite(count) or not finite(seconds) or seconds <= 0 or count < 0:
        return None
    k = round(float(count))
    a = 1 - CONFIDENCE
    lo = stats.chi2.ppf(a / 2, 2 * k) / 2 if k > 0 else 0.0
    hi = stats.chi2.ppf(1 - a / 2, 2 * k + 2) / 2
    return float(lo) / seconds, float(hi) / seconds


def method_text(min_requests: int) -> str:
    """One paragraph for the report: how the intervals are made and what is withheld."""
    return (f"**Intervals and sample sizes.** Every ratio is shown with the successful requests "
            f"behind it (n, per arm and step) and a {CONFIDENCE:.0%} interval: each step's "
            f"requests are bootstrapped ({RESAMPLES:,} resamples, scipy.stats.bootstrap, seed "
            f"{SEED}) to get the standard error of the log of its TPOT p50; output and goodput "
            f"tokens/s get theirs from the ratio estimator of a closed loop (tokens over the "
            f"time the requests took, clustered by the requests sent together, t quantile); a "
            f"ratio of the two arms gets r·exp(±z·√(se_spec² + se_base²)) (independent arms), "
            f"z = {Z:.2f} for a step measured once and larger for a step that was looked at "
            f"more than once before it stopped (see *Decisive steps*). It covers "
            f"request-to-request variation inside a "
            f"step, not drift between the two arms' runs. A step with fewer than "
            f"{min_requests} successful requests in an arm (`--min-requests-per-step`), or "
            f"whose interval cannot tell the ratio from 1.0×, yields **not enough data** "
            f"instead of a speedup, crossover or knee. An interval inside "
            f"{1 / (1 + EVEN_TOL):.2f}×–{1 + EVEN_TOL:.2f}× counts as \"even\"; differences "
            f"under {MIN_TOL:.0%} never count as clear.")


def has_intervals(table: pd.DataFrame) -> bool:
    """Whether the table carries the per-request interval columns (a new steps.csv)."""
    return "tpot_p50_log_se" in table.columns and bool(table["tpot_p50_log_se"].notna().any())


def interval_note(table: pd.DataFrame, why: str | None = None) -> str | None:
    """A warning for a table without intervals (a steps.csv older than them, or ``why``: peer
    runs without per-request records), else None."""
    if has_intervals(table):
        return None
    if why:
        return (f"**Every interval is unavailable: {why}**, so only the request counts gate "
                f"the verdicts and differences are judged against a ±{MIN_TOL:.0%} band.")
    return ("**This steps.csv predates the per-request interval columns: every interval is "
            "unavailable**, so only the request counts gate the verdicts and differences are "
            "judged against the sub-window spread (±, `*_rse`). Re-run the sweep to get "
            "intervals.")
