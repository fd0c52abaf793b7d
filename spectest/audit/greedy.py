"""Check 1: greedy equality — at temperature 0 the candidate must emit the baseline's tokens.

Owns: comparing, per prompt, the candidate's and the baseline's temperature-0 token sequences,
locating the first divergence, measuring it, and the check's verdict.

For a divergence at generated position j (0-based; position 0 is the prefill token, which no
draft touches) the prefixes of both sequences are identical, so the baseline's scoring of the
candidate's sequence gives both tokens' logprobs *at the same prefix*:

    margin = logprob_baseline(baseline token) - logprob_baseline(candidate token)  (nats, >= 0)

A margin below the tie tolerance is a floating-point tie (two near-equal logits ordered
differently by different batch shapes or kernels) and is reported but does not fail the check;
anything above it is a real divergence.  Each real divergence also records the candidate's
*self gap*: how far the candidate's own reported logprob of its token is from the baseline's
score of the same prefix.  A large self gap means the candidate computed a different
distribution for the same tokens (its state — KV cache, positions — is wrong); a small one
with a non-argmax token means its greedy pick or verification rule is wrong.  Only the first
divergence per prompt is meaningful: after it the prefixes differ.

Does not know: HTTP, sampling statistics or report files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spectest.audit.samples import Completion, Position, PromptCase


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    index: int  # generated position, 0-based
    candidate_token: int | None  # None: the candidate's sequence ended here
    baseline_token: int | None
    margin: float | None  # baseline's logprob margin between the two tokens at this prefix
    tie: bool
    self_gap: float | None  # |candidate's reported logprob - baseline's score|, same token
    candidate_argmax: bool | None  # did the candidate emit its own reported argmax?
    drafts: int | None  # the candidate's speculation rounds for this request
    cause: str


@dataclass(frozen=True)
class GreedyResult:
    prompts: int
    exact: int
    ties: tuple[Divergence, ...]
    failures: tuple[Divergence, ...]  # largest margin first
    max_failures: int
    tie_tolerance: float
    candidate_drafts: int | None

    @property
    def exact_match_rate(self) -> float:
        return self.exact / self.prompts if self.prompts else 0.0

    @property
    def passed(self) -> bool:
        return len(self.failures) <= self.max_failures

    def reason(self) -> str:
        rate = f"exact match {self.exact}/{self.prompts} ({100 * self.exact_match_rate:.1f}%)"
        if self.passed:
            ties = f", {len(self.ties)} floating-point tie(s)" if self.ties else ""
            return f"{rate}{ties}"
        d = self.failures[0]
        margin = "unknown margin" if d.margin is None else f"margin {d.margin:.3g} nats"
        return (f"{rate}; {len(self.failures)} real divergence(s) (tolerance "
                f"{self.tie_tolerance:g} nats), largest: prompt {d.prompt_id} at generated "
                f"position {d.index + 1}, candidate {d.candidate_token} vs baseline "
                f"{d.baseline_token}, {margin}")


def _cause(index: int, self_gap: float | None, candidate_argmax: bool | None,
           gap_tolerance: float, ended: bool) -> str:
    if ended:
        return ("one sequence ended early: the servers disagree on stopping (EOS handling, "
                "max_tokens or stop rules)")
    if index == 0:
        return ("the first generated token already differs; it comes from the prefill with no "
                "drafts involved, so the servers compute different logits (model, precision "
                "or prompt), not a speculation bug")
    if self_gap is not None and self_gap > gap_tolerance:
        return (f"the candidate's own logprob for its token differs from the baseline's score "
                f"of the same prefix by {self_gap:.3g} nats: it computed a different "
                f"distribution for the same tokens — wrong state after speculative rounds "
                f"(KV-cache rewind/append, positions)")
    if candidate_argmax is False:
        return ("the candidate reports the baseline's distribution but emitted a token that is "
                "not its argmax: the greedy pick or the verification rule is wrong")
    return ("the candidate's token is not the baseline's argmax at the same prefix; its "
            "reported distribution is close to the baseline's (check the logprob/KL check)")


def compare(case: PromptCase, cand: Completion, base: Completion,
            scored: Sequence[Position | None], tie_tolerance: float,
            gap_tolerance: float) -> Divergence | None:
    """The first divergence of ``cand`` from ``base`` (None when they are equal).

    ``scored``: the baseline's echo scoring of ``case.ids + cand.tokens``.
    """
    n = len(case.ids)
    for j in range(max(len(cand.tokens), len(base.tokens))):
        c = cand.tokens[j] if j < len(cand.tokens) else None
        b = base.tokens[j] if j < len(base.tokens) else None
        if c == b:
            continue
        if c is None or b is None:
            return Divergence(case.id, j, c, b, None, False, None, None, cand.drafts,
                              _cause(j, None, None, gap_tolerance, True))
        here = scored[n + j] if n + j < len(scored) else None
        lp_c = here.logprob if here is not None else None
        lp_b = here.logprob_of(b) if here is not None else None
        if lp_b is None:  # not in the baseline's scored top-n: use its own decode logprob
            lp_b = base.positions[j].logprob
        margin = None if lp_c is None else lp_b - lp_c
        tie = margin is not None and margin < tie_tolerance
        mine = cand.positions[j]
        self_gap = None if lp_c is None else abs(mine.logprob - lp_c)
        own_max = mine.top[0][1] if mine.top else None
        cand_argmax = None if own_max is None else own_max - mine.logprob < tie_tolerance
        return Divergence(case.id, j, c, b, margin, tie, self_gap, cand_argmax, cand.drafts,
                          "floating-point tie" if tie else
                          _cause(j, self_gap, cand_argmax, gap_tolerance, False))
    return None


def check(cases: Sequence[PromptCase], cand: Sequence[Completion], base: Sequence[Completion],
          scored: Sequence[Sequence[Position | None]], tie_tolerance: float,
          gap_tolerance: float, max_failures: int = 0) -> GreedyResult:
    divergences = [compare(c, x, y, s, tie_tolerance, gap_tolerance)
                   for c, x, y, s in zip(cases, cand, base, scored)]
    real = tuple(sorted((d for d in divergences if d is not None and not d.tie),
                        key=lambda d: -(d.margin if d.margin is not None else math.inf)))
    ties = tuple(d for d in divergences if d is not None and d.tie)
    drafts = [c.drafts for c in cand if c.drafts is not None]
    return GreedyResult(len(cases), sum(d is None for d in divergences), ties, real,
                        max_failures, tie_tolerance, sum(drafts) if drafts else None)
