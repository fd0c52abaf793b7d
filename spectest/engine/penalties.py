"""Logit adjustments that depend on the tokens so far: ``logit_bias`` and the penalties.

Owns: :class:`Penalties` (one batch's per-row bias, presence / frequency / repetition
penalties, the counts of each row's generated tokens and the set of its prompt tokens) and the
pure tensor functions that apply them per position (:func:`apply_penalties`) with the counts a
position sees (:func:`position_counts`: a verified position j also sees the drafts before it).

vLLM's semantics and order (its sampler): ``logit_bias`` is added first; then the repetition
penalty divides the positive logits and multiplies the negative ones of every token that occurs
in the prompt or the output; then ``frequency_penalty × count`` and ``presence_penalty × [count >
0]`` are subtracted, counting the output only. Greedy decoding takes the argmax of the adjusted
logits; temperature, min-p, top-k and top-p come after (``sampling.probs_from_logits``).

Speculation keeps this exact when the draft and the target adjust their logits for the same
history: the draft at its j-th step and the target at verified position j both see the
committed tokens plus the j drafts before. Logprobs a server reports stay those of the raw
logits (vLLM's default).

Does not know: models, caches, requests or drafters — callers pass params, tokens and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from spectest.engine.sampling import SamplingParams


@dataclass(frozen=True)
class Penalties:
    bias: torch.Tensor  # [B, V] added to the logits (0 where none)
    presence: torch.Tensor  # [B]
    frequency: torch.Tensor  # [B]
    repetition: torch.Tensor  # [B] (1 = off)
    output_counts: torch.Tensor  # [B, V] float: occurrences of each token in the output so far
    in_prompt: torch.Tensor  # [B, V] bool

    @staticmethod
    def of(params: Sequence[SamplingParams], tokens: Sequence[Sequence[int]],
           prompt_lens: Sequence[int], vocab: int) -> Penalties | None:
        """The batch's adjustments, or None when no row has any (the common case: free).

        ``tokens[b]``: row b's prompt + output so far (the committed tokens); its first
        ``prompt_lens[b]`` are the prompt."""
        if not any(p.penalized for p in params):
            return None
        B = len(params)
        bias = torch.zeros(B, vocab)
        counts = torch.zeros(B, vocab)
        in_prompt = torch.zeros(B, vocab, dtype=torch.bool)
        for b, (p, toks, n) in enumerate(zip(params, tokens, prompt_lens)):
            if not p.penalized:
                continue
            for token, value in p.logit_bias:
                if 0 <= token < vocab:
                    bias[b, token] += value
            if p.repetition_penalty != 1.0:
                in_prompt[b, torch.tensor(toks[:n], dtype=torch.long)] = True
            if len(toks) > n:
                counts[b] = torch.bincount(torch.tensor(toks[n:], dtype=torch.long),
                                           minlength=vocab)[:vocab].float()
        return Penalties(bias, torch.tensor([p.presence_penalty for p in params]),
                         torch.tensor([p.frequency_penalty for p in params]),
                         torch.tensor([p.repetition_penalty for p in params]), counts,
                         in_prompt)

    def select(self, rows: torch.Tensor) -> Penalties:
        """The adjustments of ``rows`` [b] (indices into the batch)."""
        return Penalties(self.bias[rows], self.presence[rows], self.frequency[rows],
                         self.repetition[rows], self.output_counts[rows], self.in_prompt[rows])


def position_counts(output_counts: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
    """Output counts each position sees: output_counts [B, V] (before the round), drafted
    [B, K] (the round's drafts, padding included: a padded position is never accepted) →
    [B, K+1, V], where position j also counts drafted[:, :j]."""
    B, K = drafted.shape
    if K == 0:
        return output_counts[:, None]
    seen = F.one_hot(drafted, output_counts.shape[-1]).float().cumsum(1)  # [B, K, V]
    return output_counts[:, None] + torch.cat([seen.new_zeros(B, 1, seen.shape[-1]), seen], 1)


def apply_penalties(logits: torch.Tensor, pen: Penalties, counts: torch.Tensor,
                    columns: torch.Tensor | None = None) -> torch.Tensor:
    """Adjusted logits [B, T, N] in float32.

    logits [B, T, N]; counts [B, T, V] (what each position has generated before it,
    :func:`position_counts`); ``columns`` [N]: the token id of each logit column where the
    logits cover part of the vocabulary (a draft head cut to its frequent tokens), else None
    (N = V)."""
    bias, in_prompt = pen.bias[:, None], pen.in_prompt[:, None]  # [B, 1, V]
    if columns is not None:
        bias, in_prompt, counts = bias[..., columns], in_prompt[..., columns], counts[..., columns]
    x = logits.float() + bias  # [B, T, N]
    rep = pen.repetition[:, None, None]  # [B, 1, 1]
    seen = in_prompt | (counts > 0)  # [B, T, N]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    return (x - pen.frequency[:, None, None] * counts
            - pen.presence[:, None, None] * (counts > 0).float())
