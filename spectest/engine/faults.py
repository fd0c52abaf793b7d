"""The target side's rules of a round, exact — or with deliberate bugs, for the auditor's tests.

Owns: ``FAULTS`` (each injectable correctness bug and what it breaks) and the four rules a
round follows on the target's side, chosen once when the engine is built (:func:`rules_for`):

* ``target_side`` — the temperature, top-k and top-p the target samples and verifies with;
* ``greedy_rows`` — which rows verify by greedy matching (the others by rejection sampling);
* ``verify_sampled`` — rejection sampling of the sampled rows;
* ``committed`` — the target cache's length per row once a round's tokens are accepted.

:class:`ExactRules` is what speculative decoding must do (an engine without faults runs these
and nothing else); :class:`FaultyRules` replaces the rule each injected fault breaks, and
nothing more, so the engine's round loop carries no fault branches. Never on by default:
``spectest serve`` asks for ``--i-understand-faults-break-correctness``, and an engine with
faults logs a warning when it is built.

Does not know: drafters, caches or requests beyond their sampling parameters.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch

from spectest.engine.sampling import SamplingParams
from spectest.engine.verify import verify_sampled

log = logging.getLogger("spectest.engine")

FAULTS = {
    "greedy-verify-sampled": "sampled requests verified by greedy matching",
    "draft-only-temperature": "temperature applied to the draft only (target at T=1)",
    "draft-only-top-p": "top-p applied to the draft only",
    "lossy-threshold": "accept a draft whenever its target probability exceeds a threshold",
    "kv-rewind-off-by-one": "target KV cache rewound one position too few",
}


class ExactRules:
    """Exact speculative decoding: the output is distributed as the target's alone."""

    def target_side(self, params: Sequence[SamplingParams]):
        """Per row: (temperature [B], top-k [B], top-p [B]) of the target's distribution."""
        return (torch.tensor([1.0 if p.greedy else p.temperature for p in params]),
                torch.tensor([p.top_k for p in params]),
                torch.tensor([p.top_p for p in params]))

    def greedy_rows(self, params: Sequence[SamplingParams]) -> torch.Tensor:
        return torch.tensor([p.greedy for p in params])

    def verify_sampled(self, drafts, lens, draft_probs, target_probs, accept_u, sample_u):
        return verify_sampled(drafts, lens, draft_probs, target_probs, accept_u, sample_u)

    def committed(self, start: torch.Tensor, k: int, n_prev: torch.Tensor,
                  n_accepted: torch.Tensor) -> torch.Tensor:
        """Cache lengths after a round that fed ``k + 1`` positions from ``start``: every
        committed token but the last (the next round's first input)."""
        return torch.minimum(start + k + 1, n_prev + n_accepted)


class FaultyRules(ExactRules):
    """The exact rules with each of ``faults`` (names of ``FAULTS``) in place of its rule."""

    def __init__(self, faults: Collection[str], lossy_threshold: float):
        self.faults = frozenset(faults)
        self.lossy_threshold = lossy_threshold

    def target_side(self, params: Sequence[SamplingParams]):
        temperature, top_k, top_p = super().target_side(params)
        if "draft-only-temperature" in self.faults:
            temperature = torch.ones(len(params))
        if "draft-only-top-p" in self.faults:
            top_p = torch.ones(len(params))
        return temperature, top_k, top_p

    def greedy_rows(self, params: Sequence[SamplingParams]) -> torch.Tensor:
        if "greedy-verify-sampled" in self.faults:
            return torch.ones(len(params), dtype=torch.bool)
        return super().greedy_rows(params)

    def verify_sampled(self, drafts, lens, draft_probs, target_probs, accept_u, sample_u):
        return verify_sampled(drafts, lens, draft_probs, target_probs, accept_u, sample_u,
                              lossy_threshold=(self.lossy_threshold
                                               if "lossy-threshold" in self.faults else None))

    def committed(self, start, k, n_prev, n_accepted):
        extra = 1 if "kv-rewind-off-by-one" in self.faults else 0
        return torch.minimum(start + k + 1, n_prev + n_accepted + extra)


def rules_for(faults: Collection[str], lossy_threshold: float = 0.1) -> ExactRules:
    """The exact rules, or — with faults — the faulty ones, said loudly in the log."""
    if not faults:
        return ExactRules()
    log.warning("!!! FAULT INJECTION ENABLED: %s — outputs are deliberately WRONG; "
                "never serve real traffic with this engine !!!",
                ", ".join(f"{f} ({FAULTS[f]})" for f in sorted(faults)))
    return FaultyRules(faults, lossy_threshold)
