"""The baseline's noise floor: how far the baseline disagrees with *itself* on the same prefix.

Owns: measuring it and widening the checks' tolerances to it.

Why: an engine is not batch-invariant unless it was built to be. llama.cpp (Q4 weights, CPU)
computes a prefix's logits differently when the prefix arrives as one prefill batch than when
it was decoded token by token, and differently again with another slot busy: measured on
SmolLM2-135M Q4_1, the *same non-speculative server* scored the same prefix up to 0.16 nats
apart and its greedy output diverged from itself on 1 of 6 prompts (margin 0.037 nats).
Speculation verifies K + 1 tokens in one batch, so a speculative candidate differs from its
baseline by at least that much for reasons that have nothing to do with speculation. Holding
it to a tighter standard than the baseline meets against itself would call every such server
lossy; ignoring the floor would hide it. So the auditor measures it, reports it, and widens
each tolerance to ``FACTOR`` × the floor when the floor exceeds the configured value (the mean
KL to at least the floor's 95th percentile: the candidate's mean may rest on a handful of
positions when most of its tokens came from drafts and carry no logprobs). A maximum widened to
the floor is a maximum over the floor's n positions, so a candidate with N > n positions is
held to its ceil(N / n)-th largest value (``logprobs.rank_for``): its plain maximum would beat
the floor's by chance alone with probability N / (N + n). Measured on int8 SmolLM2 with two
equally exact attention kernels: the floor's max KL over 96 positions read 0.19 with one and
0.075 with the other, and the candidate's plain max over 480 positions (0.21) then failed
2 × 0.075 while its 5th largest sat inside it.

How: for every prompt, the baseline's own greedy run (decoded token by token, logprobs as it
went) is scored again by the baseline. With echo, the whole run in one forward, every position
from the first generated token on — the comparison the logprob check makes, whose first
position is likewise one prefill against another (the middle-only version missed it: on
int8 SmolLM2 it read max |Δlogprob| 0.36 over 96 second-half positions while the candidate's
first positions, which no draft touches, moved up to 0.91; over whole runs the floor reads 0.81
over 192). By generation (llama.cpp), from the middle of the run — the second half's prefix
now arrives as one batch; llama.cpp is asked not to reuse its prompt cache, or it would return
the decoded values it kept. Where both report a
position and the tokens agree, the two readings of the same prefix are compared exactly as the
logprob check compares candidate and baseline (|Δlogprob| of the emitted token, shared-support
KL, top-1 disagreement that is not a near-tie).

A state bug from speculation (a wrong KV rewind, positions off by one) moves logprobs by
O(1) nats, two to three orders of magnitude above these floors; a lossy acceptance rule is
caught by the distribution test, which this does not widen: where the floor is above the KL
tolerance, the scoring route is not the distribution the baseline samples from, and the
distribution test compares the candidate with the baseline's own samples instead
(``two_sample``; ``runner._control_reason``).

Does not know: HTTP routes (``scoring``) or report files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectest.audit import scoring
from spectest.audit.client import Client
from spectest.audit.logprobs import Thresholds, compare
from spectest.audit.samples import Completion, PromptCase

FACTOR = 2.0  # tolerances widen to FACTOR × the measured floor (maxima rank-matched: rank_for)
# Tokens a verification evaluates in one batch: the last committed token plus K drafts, for
# K = 1, 4, 8 and 16 (llama.cpp's n-gram drafter proposes up to 16 by default)
SHAPES = (2, 5, 9, 17)
MIN_TOKENS = 4  # runs shorter than this are not re-scored


@dataclass(frozen=True)
class NoiseFloor:
    positions: int  # positions compared
    max_abs_logprob: float
    mean_kl: float
    max_kl: float
    top1_disagreement: float  # share of positions
    p95_kl: float = 0.0  # a mean over few candidate positions can sit this high by chance
    shaped_positions: int = 0  # of ``positions``, read in verification-shaped batches
    shaped_max_kl: float = 0.0

    @property
    def measured(self) -> bool:
        return self.positions > 0

    def widen(self, t: Thresholds, tie_tolerance: float) -> tuple[Thresholds, float]:
        """Thresholds and tie tolerance no tighter than FACTOR × this floor."""
        if not self.measured:
            return t, tie_tolerance
        kl_floor, abs_floor = FACTOR * self.max_kl, FACTOR * self.max_abs_logprob
        return (Thresholds(max(t.max_kl, kl_floor),
                           max(t.mean_kl, FACTOR * self.mean_kl, self.p95_kl),
                           max(t.max_abs_logprob, abs_floor),
                           max(t.max_top1_disagreement, FACTOR * self.top1_disagreement),
                           self.positions if kl_floor > t.max_kl else t.max_kl_over,
                           self.positions if abs_floor > t.max_abs_logprob
                           else t.max_abs_logprob_over),
                max(tie_tolerance, FACTOR * self.max_abs_logprob))

    def summary(self) -> str:
        if not self.measured:
            return "not measured"
        shaped = (f" ({self.shaped_positions} in verification-shaped batches: max KL "
                  f"{self.shaped_max_kl:.2g})" if self.shaped_positions else "")
        return (f"{self.positions} positions{shaped}: max |Δlogprob| "
                f"{self.max_abs_logprob:.3g}, mean KL {self.mean_kl:.2g}, max KL "
                f"{self.max_kl:.2g}, top-1 disagreement {100 * self.top1_disagreement:.2f}%")


async def measure(base: Client, cases: Sequence[PromptCase], runs: Sequence[Completion],
                  logprobs: int, tie_tolerance: float) -> NoiseFloor:
    """Re-score the second half of each baseline greedy run and compare (see module doc)."""
    jobs = [(case, run) for case, run in zip(cases, runs) if len(run.tokens) >= MIN_TOKENS]
    whole = base.routes.echo and base.routes.token_ids  # echo scores the run in one forward
    starts = [0 if whole else len(run.tokens) // 2 for _, run in jobs]
    rescored = await asyncio.gather(*(
        scoring.score(base, case, run.tokens, logprobs, start=start, pieces=run.pieces,
                      fresh=True) for (case, run), start in zip(jobs, starts)))
    diffs = []
    for (case, run), again, start in zip(jobs, rescored, starts):
        n = len(case.ids)
        for j in range(start, len(run.tokens)):
            first, second = run.positions[j], again[n + j]
            if second is None or not first.reported:
                continue
            diffs.append(compare(case.id, j, first, second, tie_tolerance))
    shaped = await verify_shaped(base, jobs, logprobs, tie_tolerance)
    return floor_of(diffs + shaped, shaped)


def floor_of(diffs: Sequence, shaped: Sequence = ()) -> NoiseFloor:
    """The floor over ``diffs`` (``logprobs.compare`` results; ``shaped``: those of them read
    in verification-shaped batches)."""
    if not diffs:
        return NoiseFloor(0, 0.0, 0.0, 0.0, 0.0)
    kl = np.array([d.kl for d in diffs])
    return NoiseFloor(len(diffs), max(d.abs_diff for d in diffs), float(kl.mean()),
                      float(kl.max()), sum(d.top1_disagree for d in diffs) / len(diffs),
                      float(np.quantile(kl, 0.95)), len(shaped),
                      max((d.kl for d in shaped), default=0.0))


async def verify_shaped(base: Client, jobs: Sequence[tuple[PromptCase, Completion]],
                        logprobs: int, tie_tolerance: float) -> list:
    """The baseline's reading of its own prefixes where speculation puts them: the last
    ``B`` tokens of a prefix evaluated in one batch on top of a cached rest, ``B`` in
    ``SHAPES`` — a verification's shape — against the reading decoded token by token (its
    greedy run). Needs a prefix cache and a way to keep a request on one cache slot
    (``Flavour.slot_field``: llama.cpp's ``id_slot``): the first request leaves
    prompt + run[:j − B] in the slot, the second sends prompt + run[:j] to the same slot, so
    the server evaluates the last ``B`` tokens together and reports position ``j`` from the
    batch's last row. Servers without (echo scoring: one prefill) measure none here."""
    flavour = base.routes.flavour
    field = flavour.slot_field if flavour else ""
    if not field or base.routes.echo or not base.routes.token_ids:
        return []
    work: asyncio.Queue = asyncio.Queue()
    for i, (case, run) in enumerate(jobs):  # two shapes a run, all four every two runs
        half = len(run.tokens) // 2
        for k, width in enumerate(SHAPES[i % 2::2]):
            j = half + 2 * k
            if j - width >= 1 and j < len(run.tokens) and run.positions[j].reported:
                work.put_nowait((case, run, j, width))
    out = []

    async def worker(slot: int) -> None:
        while not work.empty():
            case, run, j, width = work.get_nowait()
            prefix = list(case.ids) + list(run.tokens[:j])
            await scoring._generate(base, prefix[:len(prefix) - width], 1, 1,
                                    extra={field: slot})
            comp, _ = await scoring._generate(base, prefix, 1, logprobs, extra={field: slot})
            if comp.positions and comp.positions[0].reported:
                out.append(compare(case.id, j, run.positions[j], comp.positions[0],
                                   tie_tolerance))

    await asyncio.gather(*(worker(slot) for slot in range(max(1, base.concurrency))))
    return out
