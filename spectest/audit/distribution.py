"""Check 3: does the candidate *sample* from the baseline's distribution (temperature > 0)?

Owns: the sampling transform (raw logprobs → the distribution a correct server samples from),
the probability-integral-transform (PIT) test of the candidate's sampled tokens against the
baseline's distributions at the same prefixes, and its diagnostics (effective temperature,
argmax share, tokens outside the support, first token vs later tokens) with a pointer at the
likely cause when it fails.

Does not know: HTTP, prompts or verdict files. It receives, for every sampled token, the
candidate's token and the baseline's scoring of the same prefix (echo + top-n logprobs).

The math
--------
Data.  For every candidate sample (prompt i, seed s) and generated position t, the baseline
scores the candidate's own prefix and reports its raw top-n logprobs l_t (n = 20).  With the
requested temperature T, top-k k <= n and top-p P, a correct server samples from

    p_t(j) ∝ exp(l_t(j) / T) over the k best tokens, then truncated to the smallest prefix of
    that sorted distribution whose mass reaches P, renormalised          (vLLM/spectest order)

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
    sides, which Z and KS barely notice (measured on the embedded pair: W = 47-69 where
    |Z| ≈ 2-3 at a default audit).
Tokens outside the support (p_t(x) = 0) are impossible under H0: any one of them fails the
check outright, unless it lies within --support-tolerance of the support's edge (float noise).
Positions whose support has one token carry no information and are left out.

False-positive rate: alpha exactly for the PIT/KS part and asymptotically for Z and W (N is in
the thousands); Bonferroni makes the check's rate <= alpha.  Power against a per-token total-
variation shift of 0.05, the runtime of a default audit, and the comparison with the
two-sample G-test (sample k short continuations per prompt from each server, G-test per
prompt, Holm over prompts) are measured by ``benchmarks/audit_power.py``.  The default
temperature 0.5 was chosen by measurement too: it keeps several candidate tokens at most
positions and makes a lossy threshold move the most mass.  What a one-token-per-prefix test
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
    z = raw / spec.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if spec.top_p < 1:
        before = np.cumsum(p) - p
        keep = before < spec.top_p
        keep[0] = True
        ids, p = ids[keep], p[keep] / p[keep].sum()
    return TokenDist(ids, p, raw, float(raw[-1]))


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
            full = sampling_dist(scored.top, SamplingSpec(spec.temperature, 1.0, spec.top_k))
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
    p_value: float  # Bonferroni over the three
    mean_u: float
    calibration: Calibration | None = None

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


# --- the check -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sampled:
    """One candidate token to test: the prompt, its position, and the baseline's scoring."""

    prompt: int  # index into the prompt list
    index: int  # generated position, 0-based
    token: int
    scored: Position  # the baseline's scoring of this prefix
    own: Position | None = None  # the candidate's own report for this token


@dataclass(frozen=True)
class SegmentStats:
    """Descriptive figures for one group of positions (first token / later tokens)."""

    pit: PitResult
    shift_per_token: float  # mean of log p(x) + H: > 0 sharper than the baseline, < 0 flatter
    shift_se: float
    argmax_share: float
    argmax_expected: float

    @staticmethod
    def of(draws: Sequence[Draw]) -> SegmentStats:
        n = len(draws)
        if not n:
            return SegmentStats(PitResult.empty(), 0.0, 0.0, 0.0, 0.0)
        shift = sum(d.logp - d.neg_entropy for d in draws) / n
        se = math.sqrt(sum(d.var for d in draws)) / n
        return SegmentStats(pit_test(draws), shift, se, sum(d.is_argmax for d in draws) / n,
                            sum(d.p_max for d in draws) / n)


@dataclass(frozen=True)
class DistributionResult:
    spec: SamplingSpec
    alpha: float
    tested: int  # informative positions
    skipped: int  # one-token support or edge ties
    pit: PitResult
    first: SegmentStats
    later: SegmentStats
    violations: tuple[Violation, ...]
    temperature_fit: float | None  # effective temperature of the candidate's tokens
    temperature_reference: float | None  # the same fit on tokens drawn from the baseline
    prompt_z: tuple[float, ...]  # per-prompt standardised surprise shift (descriptive)

    @property
    def passed(self) -> bool:
        return not self.violations and self.pit.p_value >= self.alpha

    def reason(self) -> str:
        p = self.pit
        figures = (f"{self.tested} sampled tokens, p = {p.p_value:.3g} (alpha {self.alpha:g}; "
                   f"surprise z = {p.z:+.2f}, KS D = {p.ks:.4f}, calibration "
                   f"chi2({p.df}) = {p.wald:.1f})")
        if self.violations:
            return f"{len(self.violations)} token(s) outside the baseline's support; {figures}"
        return figures

    def cause(self) -> str:
        """A heuristic pointer at the likely bug, from the diagnostics (empty when passed)."""
        if self.passed:
            return ""
        kinds = {v.reason for v in self.violations}
        own = [v.in_candidate_support for v in self.violations
               if v.in_candidate_support is not None]
        if own and sum(own) > len(own) / 2:
            return ("the out-of-support tokens are inside the support of the candidate's own "
                    "reported distribution: the candidate computes a different distribution "
                    "for the same prefix (see the logprob/KL check) — a state bug (KV cache, "
                    "positions), not a sampler bug")
        support = ""
        if "outside top-p" in kinds:
            support = ("the candidate emits tokens outside the baseline's top-p nucleus: top-p "
                       "is not applied where tokens are accepted or resampled (e.g. top-p "
                       "applied to the draft only)")
        elif "outside top-k" in kinds:
            support = ("the candidate emits tokens outside the baseline's top-k: top-k is not "
                       "applied where tokens are accepted or resampled")
        if support and self.pit.p_value >= self.alpha:
            return support  # inside the support the tokens follow the baseline: only a cut
        first, later = self.first, self.later
        # The first generated token comes from the prefill: no draft touches it.  A shift there
        # means the sampler itself is wrong; no (significant) shift points at verification.
        at_first = first.pit.p_value < 0.01 or (
            first.shift_se > 0 and abs(first.shift_per_token) > 3 * first.shift_se)
        where = ("at every position, the prefill token included" if at_first else
                 f"(first token: no significant shift in {first.pit.n} draws)")
        t_fit, t_ref = self.temperature_fit, self.temperature_reference
        hotter = t_fit is not None and t_ref is not None and t_fit > 1.1 * t_ref
        if later.argmax_share > 0.95 and later.argmax_expected < 0.8 and not at_first:
            return ("at speculated positions the candidate almost always emits the baseline's "
                    f"argmax ({100 * later.argmax_share:.0f}% vs {100 * later.argmax_expected:.0f}"
                    "% expected) while the prefill token is fine: sampled requests are verified "
                    "by greedy matching")
        if hotter:
            return (f"tokens are sampled hotter than requested (effective temperature "
                    f"{t_fit:.2f} vs {t_ref:.2f} expected) {where}: the temperature is not "
                    f"applied on the target side (e.g. applied to the draft only)")
        if at_first:
            how = "sharper" if later.shift_per_token > 0 else "flatter"
            return (f"the tokens differ from the baseline's distribution {where}: the "
                    f"candidate's sampler is {how} than the requested temperature/top-k/top-p")
        cal = later.pit.calibration
        if cal is not None and max(cal.z) > 3:
            k = int(np.argmax(cal.z))
            ratio = cal.observed[k] / max(cal.expected[k], 1e-9)
            return (f"tokens to which the baseline gives probability {cal.edges[k]:g}-"
                    f"{cal.edges[k + 1]:g} are over-chosen at speculated positions (x{ratio:.2f},"
                    f" z {cal.z[k]:+.1f}) {where}: a lossy acceptance rule (drafts accepted "
                    f"when their target probability passes a threshold) or biased verification")
        if later.shift_per_token > 0:
            return (f"likely tokens are over-chosen at speculated positions {where}: a lossy "
                    f"acceptance rule (acceptance threshold) or biased verification")
        if support:
            return support
        return (f"unlikely tokens are over-chosen at speculated positions {where}: the "
                f"rejection-sampling residual or acceptance ratio is wrong")


def check(items: Sequence[Sampled], spec: SamplingSpec, alpha: float, n_prompts: int,
          seed: int, support_tolerance: float) -> DistributionResult:
    rng = np.random.default_rng(seed)
    draws, violations, fit_pairs, dists = [], [], [], []
    skipped = 0
    for it in items:
        out = evaluate(it.prompt, it.index, it.token, it.scored, spec, float(rng.random()),
                       support_tolerance)
        if isinstance(out, Violation):
            if it.own is not None and it.own.top:
                own = sampling_dist(it.own.top, spec)
                out = replace(out, in_candidate_support=bool((own.ids == it.token).any()))
            violations.append(out)
        elif out is None:
            skipped += 1
        else:
            draws.append(out)
        d = sampling_dist(it.scored.top, spec)
        if spec.top_k > 0 and len(d.raw) > 1:
            dists.append(d)
            raw_ids = [t for t, _ in it.scored.top[:spec.top_k]]
            if it.token in raw_ids:
                fit_pairs.append((d.raw, raw_ids.index(it.token)))
    by_prompt: list[list[Draw]] = [[] for _ in range(n_prompts)]
    for d in draws:
        by_prompt[d.prompt].append(d)
    prompt_z = tuple(_z(ds) for ds in by_prompt)
    return DistributionResult(
        spec, alpha, len(draws), skipped, pit_test(draws),
        SegmentStats.of([d for d in draws if d.index == 0]),
        SegmentStats.of([d for d in draws if d.index > 0]), tuple(violations),
        effective_temperature(fit_pairs), reference_temperature(dists, rng), prompt_z)


def _z(draws: Sequence[Draw]) -> float:
    var = sum(d.var for d in draws)
    return sum(d.logp - d.neg_entropy for d in draws) / math.sqrt(var) if var > 0 else 0.0
