"""Check 3, the statistics: does the candidate *sample* from the baseline's distribution?

Owns: the sampling transform (raw logprobs → the distribution a correct server samples from),
the classification of one sampled token against it (a draw, a token outside the support, or
uninformative), the pooled test (PIT + surprise z + calibration) and the effective-temperature
fit used as a diagnostic.  ``distribution_check`` runs it over an audit and explains failures.

Does not know: HTTP, prompts or verdict files. It receives, for every sampled token, the
candidate's token and the baseline's scoring of the same prefix (echo + top-n logprobs).
The test below is exact when that scoring is the distribution the baseline samples from; where
it is not (a noise floor above the tolerances: int8 weights, llama.cpp), ``two_sample`` runs the
same statistics against the baseline's own samples instead.

The math
--------
Data.  For every candidate sample (prompt i, seed s) and generated position t, the baseline
scores the candidate's own prefix and reports its raw top-n logprobs l_t (n = 20).  With the
requested temperature T, top-k k <= n and top-p P, a correct server samples from

    p_t(j) ∝ exp(l_t(j) / T) over the k best tokens, then truncated to the smallest prefix of
    that sorted distribution whose mass reaches P, renormalised          (vLLM/spectest order)

llama.cpp's sampler chain applies top-k, then top-p to softmax(l_t) at temperature 1, then the
temperature to what is left (``order = "temperature-last"``); the nucleus then differs, so the
order is the candidate flavour's (``spectest.flavours``), never assumed.

which the top-n logprobs determine exactly (hence the default top_k = 20 = n).  With top-k off
the distribution is known only for T = 1, P = 1, where the unreported tail is one bucket.

Null hypothesis H0: every candidate token x_t is drawn from p_t given its prefix (fresh
randomness per request).  Speculation shapes positions 2, 3, …; all positions are tested.

PIT.  Order the support by p_t descending and let F_t(j) be the mass before j.  With V_t
uniform and independent, u_t = F_t(x_t) + V_t·p_t(x_t) is exactly U(0,1) given the prefix
under H0, so (u_t) are i.i.d. U(0,1) across positions, samples and prompts (each u_t is
uniform conditionally on everything before it).  One pooled sample of N uniforms: no
multiple testing over prompts or positions.

Three statistics on the pooled sample, combined by Bonferroni (each at alpha/3):
  * Z ("surprise" score test).  s_t = log p_t(x_t) has, under H0, mean -H(p_t) and variance
    Var_t = Σ p log² p - H².  Z = Σ (s_t + H_t) / sqrt(Σ Var_t) → N(0,1) (martingale CLT).
    It is the locally most powerful test against a temperature change (p^(1+θ)): it catches
    sharpening (greedy verification, lower temperature: Z > 0) and flattening (temperature
    not applied, top-p not applied: Z < 0).
  * Kolmogorov-Smirnov on the u_t: an omnibus test for any change in which *ranks* get chosen.
  * Calibration (Wald): how often the chosen token's baseline probability falls in each of
    the fixed bins PROB_BINS, against Σ_t p_t(bin); the covariance is exact (Σ_t of the
    per-position multinomial covariances), W → χ²(bins - 1).  It sees shifts that are not
    monotone in p — a lossy acceptance threshold moves mass *into* 0.1 <= p < 0.4 from both
    sides, which Z and KS barely notice (the engine's lossy-threshold fault on the embedded
    pair, default audit size: W = 47-69, p ~ 1e-8..1e-12, where Z = 2.0-3.4).
Tokens outside the support (p_t(x) = 0) are impossible under H0: any one of them fails the
check outright, unless it lies within --support-tolerance of the support's edge (float noise).
Positions whose support has one token carry no information and are left out.

False-positive rate: alpha exactly for the PIT/KS part and asymptotically for Z and W (N is in
the thousands); Bonferroni makes the check's rate <= alpha.  Power against a per-token total-
variation shift of 0.05, the runtime of a default audit, and the comparison with the
two-sample G-test (sample k short continuations per prompt from each server, G-test per
prompt, Holm over prompts) are measured by ``benchmarks/audit_power.py``; on the embedded
pair at default settings (~6,900 informative tokens): false-positive rate 0.85% over 4,000
simulated audits (95% upper bound 1.19%), detection 100% for each of seven shift kinds at
TV 0.05 (500 audits each), the two-sample G-test 49% on average with the same budget.  The
default temperature 0.5 was chosen by measurement too: of 0.3, 0.5 and 0.8 it gave the
lossy-threshold fault its clearest signal while keeping several candidate tokens at most
positions.  What a one-token-per-prefix test
cannot see: a shift whose direction is random per prefix and averages out (e.g. wrong logits
from a state bug) — the logprob/KL check, which compares the distributions themselves,
catches those.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import optimize, stats

from spectest.audit.samples import AuditError, Position

TAIL = -1  # the token id standing for "every token the server did not report"
# Probability bins of the calibration test, fixed in advance (roughly log-spaced).
PROB_BINS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0)


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 0.5
    top_p: float = 0.95
    top_k: int = 20
    order: str = "temperature-first"  # or "temperature-last" (llama.cpp), see above

    def check(self, n_logprobs: int) -> None:
        if not self.temperature > 0:
            raise AuditError("distribution test: --temperature must be > 0")
        if not 0 < self.top_p <= 1:
            raise AuditError("distribution test: --top-p must be in (0, 1]")
        if self.top_k > n_logprobs:
            raise AuditError(f"distribution test: --top-k {self.top_k} exceeds --logprobs "
                             f"{n_logprobs}; the baseline must report every token that can "
                             f"be sampled")
        if self.top_k <= 0 and (self.temperature != 1 or self.top_p != 1):
            raise AuditError("distribution test: with top-k off the sampling distribution is "
                             "only known at temperature 1 and top-p 1; set --top-k <= "
                             f"{n_logprobs}")


@dataclass(frozen=True)
class TokenDist:
    """The distribution a correct server samples from at one prefix, most likely first."""

    ids: np.ndarray  # support token ids (TAIL for the unreported rest)
    probs: np.ndarray
    raw: np.ndarray  # raw logprobs of the top-k (for the temperature fit)
    edge: float  # raw logprob of the last top-k token (top-k boundary), -inf when none


def sampling_dist(top: Sequence[tuple[int, float]], spec: SamplingSpec) -> TokenDist:
    ids = np.array([t for t, _ in top], dtype=np.int64)
    raw = np.array([lp for _, lp in top], dtype=np.float64)
    if spec.top_k <= 0:  # T = 1, P = 1: reported tokens plus one tail bucket
        tail = max(0.0, 1.0 - float(np.exp(raw).sum()))
        probs = np.append(np.exp(raw), tail)
        probs /= probs.sum()
        return TokenDist(np.append(ids, TAIL), probs, raw, -math.inf)
    ids, raw = ids[:spec.top_k], raw[:spec.top_k]
    kept = raw
    if spec.order == "temperature-last":  # top-p on softmax(raw) over the top-k, then T
        nucleus = np.exp(raw - raw.max())
        keep = _nucleus(nucleus / nucleus.sum(), spec.top_p)
        ids, kept = ids[keep], raw[keep]
    z = kept / spec.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if spec.order != "temperature-last":
        keep = _nucleus(p, spec.top_p)
        ids, p = ids[keep], p[keep] / p[keep].sum()
    return TokenDist(ids, p, raw, float(raw[-1]))


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Mask of the smallest prefix of ``probs`` (sorted descending) whose mass reaches top_p."""
    keep = (np.cumsum(probs) - probs) < top_p
    keep[0] = True
    return keep


@dataclass(frozen=True)
class Draw:
    """One candidate token evaluated against the baseline's distribution at its prefix."""

    prompt: int
    index: int  # generated position, 0-based (0 = the prefill token)
    u: float  # randomized PIT value
    logp: float  # log p_t(x_t) under the sampling distribution
    neg_entropy: float  # E[log p_t] = -H(p_t)
    var: float  # Var[log p_t(x)] under p_t
    p_max: float
    is_argmax: bool
    bin: int  # probability bin of the chosen token (PROB_BINS)
    bin_mass: tuple[float, ...]  # p_t's mass in each probability bin
    sample: int = 0  # which continuation of the prompt


@dataclass(frozen=True)
class Violation:
    """A token the baseline's sampling distribution gives probability zero."""

    prompt: int
    index: int
    token: int
    baseline_logprob: float
    reason: str  # "outside top-k" | "outside top-p"
    # Is the token inside the support computed from the candidate's *own* reported logprobs?
    # Yes: the candidate's distribution differs (a state bug); no: its sampler ignores top-k/p.
    in_candidate_support: bool | None = None
    sample: int = 0  # which continuation of the prompt


def evaluate(prompt: int, index: int, token: int, scored: Position, spec: SamplingSpec,
             v: float, tie_tol: float) -> Draw | Violation | None:
    """Classify one token. None: uninformative (one-token support) or a tie at the edge."""
    dist = sampling_dist(scored.top, spec)
    hit = np.nonzero(dist.ids == token)[0]
    if not len(hit) and spec.top_k <= 0:
        hit = np.array([len(dist.ids) - 1])  # the tail bucket
    if not len(hit):
        top_k_ids = [t for t, _ in scored.top[:spec.top_k]]
        if token in top_k_ids:  # inside top-k, cut by top-p: a tie if the cut is marginal
            full = sampling_dist(scored.top, replace(spec, top_p=1.0))
            if spec.order == "temperature-last":  # the nucleus is cut at temperature 1
                full = sampling_dist(scored.top, replace(spec, top_p=1.0, temperature=1.0))
            j = int(np.nonzero(full.ids == token)[0][0])
            before = float(full.probs[:j].sum())
            if before - spec.top_p < tie_tol:
                return None
            return Violation(prompt, index, token, scored.logprob, "outside top-p")
        if dist.edge - scored.logprob < tie_tol:
            return None
        return Violation(prompt, index, token, scored.logprob, "outside top-k")
    if len(dist.probs) < 2:
        return None
    j = int(hit[0])
    p = dist.probs
    logs = np.log(np.clip(p, 1e-300, None))
    mean = float((p * logs).sum())
    var = float((p * logs * logs).sum() - mean * mean)
    bins = np.clip(np.searchsorted(PROB_BINS, p, side="right") - 1, 0, len(PROB_BINS) - 2)
    mass = np.bincount(bins, weights=p, minlength=len(PROB_BINS) - 1)
    return Draw(prompt, index, float(p[:j].sum() + v * p[j]), float(logs[j]), mean,
                max(var, 0.0), float(p[0]), j == 0, int(bins[j]), tuple(mass.tolist()))


# --- the test --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """Chosen tokens by the baseline probability of the token: observed vs expected."""

    edges: tuple[float, ...]
    observed: tuple[int, ...]
    expected: tuple[float, ...]
    z: tuple[float, ...]  # per bin, (O - E) / sd


@dataclass(frozen=True)
class PitResult:
    n: int
    z: float  # surprise score statistic
    p_z: float
    ks: float  # Kolmogorov-Smirnov D of the PIT values
    p_ks: float
    wald: float  # calibration statistic, chi-square with df degrees of freedom under H0
    df: int
    p_cal: float
    p_value: float  # Bonferroni over the ``tests`` statistics
    mean_u: float
    calibration: Calibration | None = None
    # "one-sample": against the baseline's scoring; "two-sample": against the baseline's own
    # samples (``two_sample``), control_n of them, p-values from ``permutations`` relabellings
    method: str = "one-sample"
    control_n: int = 0
    permutations: int = 0
    p_support: float = 1.0  # two-sample: rate of tokens outside the support vs the control's
    tests: int = 3  # how many p-values p_value is the Bonferroni minimum of

    @staticmethod
    def empty() -> PitResult:
        return PitResult(0, 0.0, 1.0, 0.0, 1.0, 0.0, 0, 1.0, 1.0, 0.5)


def calibration_test(draws: Sequence[Draw]) -> tuple[float, int, float, Calibration]:
    """Wald test that chosen tokens fall in each probability bin as often as p_t predicts.

    e_t (one-hot bin of x_t) has conditional mean m_t and covariance diag(m_t) - m_t m_tᵀ under
    H0, so O - E = Σ (e_t - m_t) is a martingale with quadratic variation C = Σ Cov_t and
    W = (O - E)ᵀ C⁻¹ (O - E) → χ²(df) (one bin dropped: the counts sum to N).
    """
    mass = np.array([d.bin_mass for d in draws])
    observed = np.bincount([d.bin for d in draws], minlength=mass.shape[1])
    expected = mass.sum(0)
    cov = np.diag(expected) - mass.T @ mass
    sd = np.sqrt(np.maximum(np.diag(cov), 1e-12))
    table = Calibration(PROB_BINS, tuple(int(x) for x in observed),
                        tuple(float(x) for x in expected),
                        tuple(float(x) for x in (observed - expected) / sd))
    keep = np.nonzero(expected > 5)[0][:-1]  # bins with support, minus one (dependency)
    if not len(keep):
        return 0.0, 0, 1.0, table
    d = (observed - expected)[keep]
    wald = float(d @ np.linalg.lstsq(cov[np.ix_(keep, keep)], d, rcond=None)[0])
    return wald, len(keep), float(stats.chi2.sf(wald, len(keep))), table


def pit_test(draws: Sequence[Draw]) -> PitResult:
    if not draws:
        return PitResult.empty()
    u = np.fromiter((d.u for d in draws), float, len(draws))
    dev = sum(d.logp - d.neg_entropy for d in draws)
    var = sum(d.var for d in draws)
    z = dev / math.sqrt(var) if var > 0 else 0.0
    p_z = float(2 * stats.norm.sf(abs(z)))
    ks = stats.kstest(u, "uniform")
    wald, df, p_cal, table = calibration_test(draws)
    p = min(1.0, 3 * min(p_z, float(ks.pvalue), p_cal))
    return PitResult(len(draws), float(z), p_z, float(ks.statistic), float(ks.pvalue), wald,
                     df, p_cal, p, float(u.mean()), table)


def effective_temperature(pairs: Iterable[tuple[np.ndarray, int]]) -> float | None:
    """Maximum-likelihood T' for tokens drawn from softmax(raw / T') over the reported top-k.

    ``pairs``: (raw top-k logprobs, index of the chosen token).  A descriptive figure: compare
    it with the same fit on tokens drawn from the baseline (:func:`reference_temperature`),
    since top-p truncation biases it.
    """
    rows = [(r, j) for r, j in pairs if len(r) > 1]
    if len(rows) < 10:
        return None
    width = max(len(r) for r, _ in rows)
    raw = np.full((len(rows), width), -np.inf)
    for i, (r, _) in enumerate(rows):
        raw[i, :len(r)] = r
    chosen = np.array([r[j] for r, j in rows])

    def nll(log_t: float) -> float:
        z = raw / math.exp(log_t)
        m = z.max(1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(z - m).sum(1)))
        return float(-(chosen / math.exp(log_t) - lse).sum())

    res = optimize.minimize_scalar(nll, bounds=(math.log(0.02), math.log(20.0)),
                                   method="bounded")
    return float(math.exp(res.x))


def reference_temperature(dists: Sequence[TokenDist], rng: np.random.Generator) -> float | None:
    """The fit of :func:`effective_temperature` on tokens drawn from the baseline itself."""
    pairs = []
    for d in dists:
        j = int(rng.choice(len(d.probs), p=d.probs))
        if d.ids[j] != TAIL:
            pairs.append((d.raw, j))
    return effective_temperature(pairs)
