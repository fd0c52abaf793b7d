"""Check 2: the candidate's reported logprobs against the baseline's scoring of the same prefix.

Owns: per-position comparison of two top-n logprob lists, the aggregate figures (KL, largest
absolute logprob difference, rank agreement, each split into the first generated token and the
later ones) and the check's verdict.

Every token the candidate generated (greedy and sampled runs) comes with the candidate's own
logprob and top-n; the baseline scores the candidate's sequence (echo + logprobs) and reports
the same at the same prefix.  Both are the raw model distribution (before temperature/top-k/
top-p), so a correct candidate agrees up to floating-point noise whatever it sampled.

KL on the shared top-n support, stated precisely: let S be the tokens present in *both* lists.
Both distributions are coarsened to |S| + 1 outcomes — each token of S, plus one bucket
"everything else" holding 1 - Σ_S p (resp. 1 - Σ_S q).  All these masses are known exactly, so

    KL_S(baseline ‖ candidate) = Σ_{j∈S} p_j log(p_j / q_j) + p_rest log(p_rest / q_rest)

is computable, and by the data-processing inequality it is a *lower bound* on the full-
vocabulary KL (equal when S holds all the mass).  Rank agreement: the share of positions where
both name the same top-1 token, not counting near-ties (baseline gap below the tie tolerance),
and where the emitted token has the same rank in both lists.

Does not know: HTTP, the distribution test or report files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectest.audit.samples import Position

_EPS = 1e-12


def shared_kl(base: Position, cand: Position) -> float:
    """KL(baseline ‖ candidate) on the shared top-n support plus one rest bucket (nats)."""
    q_of = dict(cand.top)
    q_of.setdefault(cand.token, cand.logprob)
    p_of = dict(base.top)
    p_of.setdefault(base.token, base.logprob)
    shared = [t for t in p_of if t in q_of]
    if not shared:
        return math.inf
    p = np.exp([p_of[t] for t in shared])
    q = np.exp([q_of[t] for t in shared])
    p_rest = max(0.0, 1.0 - float(p.sum()))
    q_rest = max(0.0, 1.0 - float(q.sum()))
    kl = float((p * (np.log(np.maximum(p, _EPS)) - np.log(np.maximum(q, _EPS)))).sum())
    if p_rest > 1e-9:
        kl += p_rest * (math.log(p_rest) - math.log(max(q_rest, _EPS)))
    return max(kl, 0.0)


@dataclass(frozen=True)
class PositionDiff:
    prompt_id: str
    index: int  # generated position, 0-based
    token: int
    kl: float
    # |candidate logprob - baseline logprob| of the emitted token; 0.0 where the baseline scored
    # by generation and the token is past its reported top-n (``unmeasured``: not known)
    abs_diff: float
    top1_disagree: bool  # different top-1 and not a near-tie
    rank_agree: bool
    unmeasured: bool = False  # the baseline reported no logprob for the token (past its top-n)


def compare(prompt_id: str, index: int, cand: Position, base: Position,
            tie_tolerance: float) -> PositionDiff:
    kl = shared_kl(base, cand)
    unmeasured = not math.isfinite(base.logprob)  # generation scoring: only the top-n is known
    diff = 0.0 if unmeasured else abs(cand.logprob - base.logprob)
    disagree = False
    if cand.top and base.top and cand.top[0][0] != base.top[0][0]:
        other = base.logprob_of(cand.top[0][0])
        disagree = other is None or base.top[0][1] - other >= tie_tolerance
    rank = lambda pos: next((i for i, (t, _) in enumerate(pos.top) if t == pos.token), None)
    return PositionDiff(prompt_id, index, cand.token, kl, diff, disagree,
                        rank(cand) == rank(base), unmeasured)


@dataclass(frozen=True)
class Thresholds:
    max_kl: float = 0.01
    mean_kl: float = 0.001
    max_abs_logprob: float = 0.1
    max_top1_disagreement: float = 0.01  # share of positions
    # a maximum widened to a noise floor is a maximum over the floor's positions: over N
    # positions the candidate is held to its ceil(N / n)-th largest value (0: its maximum)
    max_kl_over: int = 0
    max_abs_logprob_over: int = 0


def rank_for(positions: int, over: int) -> int:
    """Which largest value of ``positions`` values matches a maximum over ``over`` of them:
    under no difference at all, the maximum of N exchangeable readings beats the maximum of
    n < N with probability N / (N + n) (83 % for 480 against 96); the ceil(N / n)-th largest
    of N sits where the maximum of n does."""
    return max(1, math.ceil(positions / over)) if over > 0 else 1


@dataclass(frozen=True)
class Segment:
    positions: int
    mean_kl: float
    max_kl: float
    max_abs_logprob: float
    top1_disagreement: float
    rank_agreement: float
    # what the maxima are judged by (Thresholds.max_*_over): the k-th largest value
    kl_rank: int = 1
    ranked_kl: float = 0.0
    abs_rank: int = 1
    ranked_abs_logprob: float = 0.0

    @staticmethod
    def of(diffs: Sequence[PositionDiff], t: Thresholds = Thresholds()) -> Segment:
        if not diffs:
            return Segment(0, 0.0, 0.0, 0.0, 0.0, 1.0)
        kl = np.sort([d.kl for d in diffs])[::-1]
        abs_diff = np.sort([d.abs_diff for d in diffs])[::-1]
        kl_rank = min(rank_for(len(diffs), t.max_kl_over), len(diffs))
        abs_rank = min(rank_for(len(diffs), t.max_abs_logprob_over), len(diffs))
        return Segment(len(diffs), float(kl.mean()), float(kl[0]), float(abs_diff[0]),
                       sum(d.top1_disagree for d in diffs) / len(diffs),
                       sum(d.rank_agree for d in diffs) / len(diffs),
                       kl_rank, float(kl[kl_rank - 1]), abs_rank,
                       float(abs_diff[abs_rank - 1]))

    def breaches(self, t: Thresholds) -> list[str]:
        out = []
        if self.ranked_kl > t.max_kl:
            out.append(f"max KL {self.ranked_kl:.3g} > {t.max_kl:g}{_nth(self.kl_rank)}")
        if self.mean_kl > t.mean_kl:
            out.append(f"mean KL {self.mean_kl:.3g} > {t.mean_kl:g}")
        if self.ranked_abs_logprob > t.max_abs_logprob:
            out.append(f"max |Δlogprob| {self.ranked_abs_logprob:.3g} > "
                       f"{t.max_abs_logprob:g}{_nth(self.abs_rank)}")
        if self.top1_disagreement > t.max_top1_disagreement:
            out.append(f"top-1 disagreement {100 * self.top1_disagreement:.2f}% > "
                       f"{100 * t.max_top1_disagreement:g}%")
        return out


def _nth(rank: int) -> str:
    return "" if rank == 1 else f" (the {rank}-th largest: matched to the noise floor's count)"


@dataclass(frozen=True)
class LogprobResult:
    all: Segment
    first: Segment  # generated position 1 (the prefill token)
    later: Segment  # positions 2, 3, … (shaped by speculation)
    worst: tuple[PositionDiff, ...]  # largest KL first
    thresholds: Thresholds

    @property
    def passed(self) -> bool:
        return not self.all.breaches(self.thresholds)

    def cause(self) -> str:
        if self.passed:
            return ""
        if not self.first.breaches(self.thresholds):
            return ("the first generated token (prefill, no drafts) agrees but later tokens do "
                    "not: the candidate's state after speculative rounds is wrong (KV-cache "
                    "rewind/append, positions), so it scores the same prefix differently")
        return ("the distributions differ already at the first generated token, which no "
                "draft touches: the servers run different weights, precision or prompts")

    def reason(self) -> str:
        a = self.all
        figures = (f"{a.positions} positions, mean KL {a.mean_kl:.2g}, max KL {a.max_kl:.2g}, "
                   f"max |Δlogprob| {a.max_abs_logprob:.2g}, top-1 agreement "
                   f"{100 * (1 - a.top1_disagreement):.2f}%{self._ranked(a)}")
        return figures if self.passed else f"{'; '.join(a.breaches(self.thresholds))} ({figures})"

    def _ranked(self, a: Segment) -> str:
        """What the maxima were judged by when they are rank-matched to the noise floor."""
        if a.kl_rank == 1 and a.abs_rank == 1:
            return ""
        floor = max(self.thresholds.max_kl_over, self.thresholds.max_abs_logprob_over)
        return (f"; judged by the {a.kl_rank}-th largest KL, {a.ranked_kl:.2g}, and the "
                f"{a.abs_rank}-th largest |Δlogprob|, {a.ranked_abs_logprob:.2g} (the maxima "
                f"matched to the noise floor's {floor} positions)")


def check(diffs: Sequence[PositionDiff], thresholds: Thresholds, n_worst: int = 10
          ) -> LogprobResult:
    worst = tuple(sorted(diffs, key=lambda d: (-d.kl, -d.abs_diff))[:n_worst])
    return LogprobResult(Segment.of(diffs, thresholds),
                         Segment.of([d for d in diffs if d.index == 0], thresholds),
                         Segment.of([d for d in diffs if d.index > 0], thresholds), worst,
                         thresholds)
