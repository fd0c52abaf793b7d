"""The target side's rules of a round, exact — or with deliberate bugs, for the auditor's tests.

Owns: ``FAULTS`` (each injectable correctness bug and what it breaks) and the rules a round
follows on the target's side, chosen once when the engine is built (:func:`rules_for`):

* ``target_side`` — the temperature, top-k, top-p and min-p the target samples and verifies
  with, and ``target_penalties`` — the logit bias and penalties it applies (``engine.penalties``);
* ``greedy_rows`` — which rows verify by greedy matching (the others by rejection sampling);
* ``verify_sampled`` — rejection sampling of the sampled rows;
* ``committed`` — the target cache's length per row once a round's tokens are accepted;
* ``restored`` — how many positions of a prefix-cache hit are copied into a slot.

:class:`ExactRules` is what speculative decoding must do (an engine without faults runs these
and nothing else); :class:`FaultyRules` replaces the rule each injected fault breaks, and
nothing more, so the engine's round loop carries no fault branches. Never on by default:
``spectest serve`` asks for ``--i-understand-faults-break-correctness``, and an engine with
faults logs a warning when it is built.

The first five faults are *always on*: every request they touch is wrong. The others are
*conditional*, like the speculative-decoding bugs that reach production: wrong only in a batch
that mixes greedy and sampled rows, only past position 256, only on a prefix-cache hit, only
for the penalty sampling parameters, or only after ``fault_after`` requests (and then more and
more often, so acceptance decays). ``CONDITIONAL`` says which condition of an audit reaches
each; they are the positive controls of the audit's conditions (``spectest.audit``).

Does not know: drafters, caches or requests beyond their sampling parameters and the
:class:`RoundContext` the engine passes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spectest.engine.penalties import Penalties
from spectest.engine.sampling import SamplingParams
from spectest.engine.verify import verify_sampled

log = logging.getLogger("spectest.engine")

FAULTS = {
    "greedy-verify-sampled": "sampled requests verified by greedy matching",
    "draft-only-temperature": "temperature applied to the draft only (target at T=1)",
    "draft-only-top-p": "top-p applied to the draft only",
    "lossy-threshold": "accept a draft whenever its target probability exceeds a threshold",
    "kv-rewind-off-by-one": "target KV cache rewound one position too few",
    # conditional: wrong only when ...
    "mixed-batch-greedy": "in a batch that mixes greedy and sampled rows, the sampled rows are "
                          "verified by greedy matching",
    "rewind-past-256": "target KV cache rewound one position too few for rows past position "
                       "256",
    "prefix-hit-stale-kv": "on a prefix-cache hit, a speculative request's last restored "
                           "chunk of blocks is one that was never written (a block-table "
                           "off-by-one): its keys and values are zeros",
    "draft-only-penalties": "presence / frequency / repetition penalties and logit_bias applied "
                            "to the draft only: rows that verify drafts do it without them",
    "decay-after-requests": "after --fault-after finished requests, speculative rounds rewind the "
                            "target KV one position too few, more often the more requests "
                            "follow (acceptance decays as output goes wrong)",
}
# the conditional faults, and what a request must meet to be wrong
CONDITIONAL = {
    "mixed-batch-greedy": "a sampled request sharing its batch with greedy ones (load)",
    "rewind-past-256": "a sequence longer than 256 tokens (long prompts or outputs)",
    "prefix-hit-stale-kv": "a prompt whose prefix is in the cache (prefix reuse)",
    "draft-only-penalties": "a request with a penalty or logit_bias (sampling parameters)",
    "decay-after-requests": "a server that has already served --fault-after requests",
}
PAST = 256  # rewind-past-256's position
DEFAULT_FAULT_AFTER = 1500


@dataclass(frozen=True)
class RoundContext:
    """What a conditional fault may depend on, per round (host values)."""

    served: int = 0  # requests the engine has finished since it started
    drafted: np.ndarray | None = None  # [B] drafts each row verified this round


class ExactRules:
    """Exact speculative decoding: the output is distributed as the target's alone."""

    def target_side(self, params: Sequence[SamplingParams]):
        """Per row, on the host: (temperature [B], top-k [B], top-p [B], min-p [B]) of the
        target's distribution."""
        return (np.array([1.0 if p.greedy else p.temperature for p in params], np.float32),
                np.array([p.top_k for p in params], np.int64),
                np.array([p.top_p for p in params], np.float32),
                np.array([p.min_p for p in params], np.float32))

    def target_penalties(self, penalties: Penalties | None,
                         drafted: torch.Tensor | None = None) -> Penalties | None:
        """The logit adjustments the target samples and verifies with: the requests'.
        ``drafted`` [B] (device): drafts each row verifies this round (None: a prefill)."""
        return penalties

    def greedy_rows(self, params: Sequence[SamplingParams],
                    drafted: np.ndarray | None = None) -> np.ndarray:
        """Which rows verify by greedy matching [B] (host: the round branches on it;
        ``drafted`` [B]: drafts per row)."""
        return np.array([p.greedy for p in params], dtype=np.bool_)

    def verify_sampled(self, drafts, lens, draft_probs, target_probs, accept_u, sample_u):
        return verify_sampled(drafts, lens, draft_probs, target_probs, accept_u, sample_u)

    def committed(self, start: np.ndarray, k: int, n_prev: np.ndarray,
                  n_accepted: np.ndarray, ctx: RoundContext = RoundContext()) -> np.ndarray:
        """Cache lengths [B] (host) after a round that fed ``k + 1`` positions from ``start``:
        every committed token but the last (the next round's first input)."""
        return np.minimum(start + k + 1, n_prev + n_accepted)

    def restored(self, hit: int, speculative: bool, span: int) -> int:
        """Positions of a ``hit``-token prefix-cache hit (whole chunks of ``span``) copied
        into the slot: all of them."""
        return hit


class FaultyRules(ExactRules):
    """The exact rules with each of ``faults`` (names of ``FAULTS``) in place of its rule."""

    def __init__(self, faults: Collection[str], lossy_threshold: float,
                 fault_after: int = DEFAULT_FAULT_AFTER):
        self.faults = frozenset(faults)
        self.lossy_threshold = lossy_threshold
        self.fault_after = fault_after
        self._decay = np.random.default_rng(0)  # which rounds go wrong: reproducible

    def target_side(self, params: Sequence[SamplingParams]):
        temperature, top_k, top_p, min_p = super().target_side(params)
        if "draft-only-temperature" in self.faults:
            temperature = np.ones(len(params), np.float32)
        if "draft-only-top-p" in self.faults:
            top_p = np.ones(len(params), np.float32)
        return temperature, top_k, top_p, min_p

    def target_penalties(self, penalties, drafted=None):
        if "draft-only-penalties" not in self.faults or penalties is None or drafted is None:
            return penalties
        off = drafted > 0  # [B]: these rows verify as if the request had no penalties
        keep = (~off).float()[:, None]
        return Penalties(penalties.bias * keep, penalties.presence * keep[:, 0],
                         penalties.frequency * keep[:, 0],
                         torch.where(off, torch.ones_like(penalties.repetition),
                                     penalties.repetition),
                         penalties.output_counts, penalties.in_prompt)

    def greedy_rows(self, params, drafted=None):
        greedy = super().greedy_rows(params)
        if "greedy-verify-sampled" in self.faults:
            return np.ones(len(params), dtype=np.bool_)
        if "mixed-batch-greedy" in self.faults and greedy.any():
            spec = drafted > 0 if drafted is not None else np.ones_like(greedy)
            return greedy | spec  # the rows that verify drafts take the greedy rows' rule
        return greedy

    def verify_sampled(self, drafts, lens, draft_probs, target_probs, accept_u, sample_u):
        return verify_sampled(drafts, lens, draft_probs, target_probs, accept_u, sample_u,
                              lossy_threshold=(self.lossy_threshold
                                               if "lossy-threshold" in self.faults else None))

    def committed(self, start, k, n_prev, n_accepted, ctx=RoundContext()):
        extra = np.zeros_like(start)
        if "kv-rewind-off-by-one" in self.faults:
            extra += 1
        # the conditional ones touch speculated rows only (rows that verified drafts)
        spec = (ctx.drafted > 0).astype(np.int64) if ctx.drafted is not None else \
            np.ones_like(start)
        if "rewind-past-256" in self.faults:
            extra |= (start >= PAST).astype(np.int64) & spec
        late = ctx.served - self.fault_after
        if "decay-after-requests" in self.faults and late > 0:
            rate = min(1.0, late / self.fault_after)
            extra |= (self._decay.random(len(start)) < rate).astype(np.int64) & spec
        return np.minimum(start + k + 1, n_prev + n_accepted + np.minimum(extra, 1))

    def restored(self, hit: int, speculative: bool, span: int) -> int:
        if "prefix-hit-stale-kv" in self.faults and speculative and hit:
            return hit - span
        return hit


def rules_for(faults: Collection[str], lossy_threshold: float = 0.1,
              fault_after: int = DEFAULT_FAULT_AFTER) -> ExactRules:
    """The exact rules, or — with faults — the faulty ones, said loudly in the log."""
    if not faults:
        return ExactRules()
    log.warning("!!! FAULT INJECTION ENABLED: %s — outputs are deliberately WRONG; "
                "never serve real traffic with this engine !!!",
                ", ".join(f"{f} ({FAULTS[f]})" for f in sorted(faults)))
    return FaultyRules(faults, lossy_threshold, fault_after)
