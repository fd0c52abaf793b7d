"""Check 3 as a verdict: the distribution test over an audit's samples, and what it means.

Owns: running :mod:`spectest.audit.distribution`'s test over every sampled token of an audit,
the split into the first generated token (the prefill: no draft touches it) and the later,
speculated ones, the per-prompt figures, the verdict at ``alpha`` and a heuristic pointer at
the likely cause when it fails (greedy verification of sampled requests, temperature or top-p
applied to one side only, a lossy acceptance rule, wrong state).

Does not know: HTTP or report files.  The statistics and their justification live in
``distribution``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from spectest.audit import two_sample
from spectest.audit.distribution import (Draw, PitResult, SamplingSpec, TokenDist, Violation,
                                         effective_temperature, evaluate, pit_test,
                                         reference_temperature, sampling_dist)
from spectest.audit.samples import Position


@dataclass(frozen=True)
class Sampled:
    """One candidate token to test: the prompt, its position, and the baseline's scoring."""

    prompt: int  # index into the prompt list
    index: int  # generated position, 0-based
    token: int
    scored: Position  # the baseline's scoring of this prefix
    own: Position | None = None  # the candidate's own report for this token
    sample: int = 0  # which continuation of the prompt (the two-sample test's unit)


@dataclass(frozen=True)
class SegmentStats:
    """Descriptive figures for one group of positions (first token / later tokens)."""

    pit: PitResult
    shift_per_token: float  # mean of log p(x) + H: > 0 sharper than the baseline, < 0 flatter
    shift_se: float
    argmax_share: float
    argmax_expected: float

    @staticmethod
    def of(draws: Sequence[Draw], pit: PitResult | None = None) -> SegmentStats:
        """``pit``: the segment's test when already run (two-sample); None: the one-sample
        test of ``draws``."""
        n = len(draws)
        if not n:
            return SegmentStats(pit or PitResult.empty(), 0.0, 0.0, 0.0, 0.0)
        shift = sum(d.logp - d.neg_entropy for d in draws) / n
        se = math.sqrt(sum(d.var for d in draws)) / n
        return SegmentStats(pit or pit_test(draws), shift, se,
                            sum(d.is_argmax for d in draws) / n, sum(d.p_max for d in draws) / n)


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
    prompt_p: tuple[float, ...]  # per-prompt p-value of the same test (descriptive only)
    # the baseline's own samples under the one-sample test: how far its scoring route is from
    # the distribution it samples from (None: no control arm, the one-sample test decides)
    control: PitResult | None = None
    control_violations: int = 0

    @property
    def passed(self) -> bool:
        if self.control is not None:  # tokens outside the support: judged against the control
            return self.pit.p_value >= self.alpha
        return not self.violations and self.pit.p_value >= self.alpha

    def reason(self) -> str:
        p = self.pit
        figures = (f"{self.tested} sampled tokens, p = {p.p_value:.3g} (alpha {self.alpha:g}; "
                   f"surprise z = {p.z:+.2f}, KS D = {p.ks:.4f}, calibration "
                   f"{'W' if p.method == 'two-sample' else f'chi2({p.df})'} = {p.wald:.1f})")
        if self.control is not None:
            figures += (f", against {p.control_n} tokens the baseline sampled itself "
                        f"({p.permutations} permutations; the baseline's own tokens against "
                        f"its scoring: p = {self.control.p_value:.3g})")
        if self.violations and self.control is not None:
            return (f"{len(self.violations)} token(s) outside the baseline's support against "
                    f"{self.control_violations} of its own (p = {p.p_support:.3g}); {figures}")
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
        if support and self.control is not None:  # judged by rate against the control's
            p = self.pit
            if p.tests * p.p_support >= self.alpha:
                support = ""  # no more often than the baseline's own tokens
            elif p.tests * min(p.p_z, p.p_ks, p.p_cal) >= self.alpha:
                return support  # inside the support the tokens follow the baseline's
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
          seed: int, support_tolerance: float, edge_noise: float = 0.0,
          control: Sequence[Sampled] | None = None) -> DistributionResult:
    """``edge_noise`` (nats): where the baseline scores by generation it reports only its top-n,
    so a token it ranks just past the top-k edge has no logprob. Such a token is a tie at the
    edge, not a violation, when the candidate's own logprob for it is within ``edge_noise`` of
    the baseline's k-th (the two servers' ranks swap there by batch-shape noise).

    ``control``: the baseline's own sampled tokens, scored the same way.  Given, the verdict is
    the two-sample test against them (:mod:`spectest.audit.two_sample`), not the one-sample
    test against the scoring."""
    rng = np.random.default_rng(seed)
    mine = _Classified.of(items, spec, rng, support_tolerance, edge_noise)
    draws = mine.draws
    if control is None:
        by_prompt: list[list[Draw]] = [[] for _ in range(n_prompts)]
        for d in draws:
            by_prompt[d.prompt].append(d)
        return DistributionResult(
            spec, alpha, len(draws), mine.skipped, pit_test(draws),
            SegmentStats.of([d for d in draws if d.index == 0]),
            SegmentStats.of([d for d in draws if d.index > 0]), mine.violations,
            effective_temperature(mine.fit_pairs), reference_temperature(mine.dists, rng),
            tuple(pit_test(ds).p_value for ds in by_prompt))
    theirs = _Classified.of(control, spec, rng, support_tolerance, edge_noise)

    def versus(keep, seed: int, permutations: int = two_sample.PERMUTATIONS):
        a = [d for d in draws if keep(d)]
        b = [d for d in theirs.draws if keep(d)]
        outside = [[(v.prompt, v.sample) for v in side.violations if keep(v)]
                   for side in (mine, theirs)]
        return a, b, two_sample.test(a, [d.sample for d in a], b, [d.sample for d in b], seed,
                                     permutations, *outside)

    def segment(keep, seed: int) -> SegmentStats:
        a, b, pit = versus(keep, seed)
        if not a or not b:
            return SegmentStats.of(a)
        one, other = SegmentStats.of(a, pit), SegmentStats.of(b, pit)  # shifts only
        return SegmentStats(pit, one.shift_per_token - other.shift_per_token,
                            math.hypot(one.shift_se, other.shift_se), one.argmax_share,
                            other.argmax_share)

    return DistributionResult(
        spec, alpha, len(draws), mine.skipped, versus(lambda d: True, seed)[2],
        segment(lambda d: d.index == 0, seed + 1), segment(lambda d: d.index > 0, seed + 2),
        mine.violations, effective_temperature(mine.fit_pairs),
        effective_temperature(theirs.fit_pairs),
        tuple(versus(lambda d, i=i: d.prompt == i, seed + 3 + i, 199)[2].p_value
              for i in range(n_prompts)),
        control=pit_test(theirs.draws), control_violations=len(theirs.violations))


@dataclass(frozen=True)
class _Classified:
    """Sampled tokens sorted into informative draws, support violations and skipped ones."""

    draws: tuple[Draw, ...]
    violations: tuple[Violation, ...]
    skipped: int
    fit_pairs: tuple  # (raw top-k logprobs, chosen index) for the temperature fit
    dists: tuple[TokenDist, ...]

    @staticmethod
    def of(items: Sequence[Sampled], spec: SamplingSpec, rng: np.random.Generator,
           support_tolerance: float, edge_noise: float) -> _Classified:
        draws: list[Draw] = []
        violations: list[Violation] = []
        skipped = 0
        fit_pairs: list = []
        dists: list[TokenDist] = []
        for it in items:
            got = evaluate(it.prompt, it.index, it.token, it.scored, spec, float(rng.random()),
                           support_tolerance)
            if (isinstance(got, Violation) and edge_noise > 0 and got.reason == "outside top-k"
                    and it.scored.logprob == float("-inf") and it.own is not None
                    and it.own.reported
                    and sampling_dist(it.scored.top, spec).edge - it.own.logprob < edge_noise):
                got = None  # unreported by the baseline, within noise of its edge
            if isinstance(got, Violation):
                if it.own is not None and it.own.top:
                    own = sampling_dist(it.own.top, spec)
                    got = replace(got, in_candidate_support=bool((own.ids == it.token).any()))
                violations.append(replace(got, sample=it.sample))
            elif got is None:
                skipped += 1
            else:
                draws.append(replace(got, sample=it.sample))
            d = sampling_dist(it.scored.top, spec)
            if spec.top_k > 0 and len(d.raw) > 1:
                dists.append(d)
                raw_ids = [t for t, _ in it.scored.top[:spec.top_k]]
                if it.token in raw_ids:
                    fit_pairs.append((d.raw, raw_ids.index(it.token)))
        return _Classified(tuple(draws), tuple(violations), skipped, tuple(fit_pairs),
                           tuple(dists))
