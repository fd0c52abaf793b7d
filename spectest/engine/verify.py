"""Verification of drafted tokens: greedy matching and exact rejection sampling.

Owns: two pure tensor functions that take one round's drafts and the target's distributions
and return, per row, how many drafts are accepted and the one extra token the target emits
(the correction after a rejection, or the bonus token after full acceptance).

Does not know: models, caches, requests or randomness sources — uniforms are passed in, so the
functions are deterministic and testable on synthetic distributions. Every argument is a device
tensor (``draft_lens`` too) and nothing here reads one back: the caller fetches the result
once (``engine.device.fetch``).

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft x_i with probability
min(1, target_probs_i[x_i] / draft_probs_i[x_i]); at the first rejection emit a token from
normalize(max(0, target_probs_i − draft_probs_i)); if all drafts pass, emit a bonus token from
target_probs_K. The emitted sequence is distributed exactly as sampling from the target.
"""

from __future__ import annotations

import torch

from spectest.engine.sampling import sample_from


def _first_false(ok: torch.Tensor) -> torch.Tensor:
    """ok [B, K] bool → index of the first False per row (K when all True) [B]."""
    return ok.to(torch.int64).cumprod(dim=1).sum(dim=1)


def verify_greedy(draft_tokens: torch.Tensor, draft_lens: torch.Tensor,
                  target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept while the draft equals the target's argmax.

    draft_tokens [B, K] (padding past draft_lens is ignored), draft_lens [B],
    target_logits [B, K+1, V] (position i scores the token after i accepted drafts).
    Returns (n_accepted [B], next_token [B]).
    """
    B, K = draft_tokens.shape
    target_argmax = target_logits.argmax(dim=-1)  # [B, K+1]
    in_draft = torch.arange(K, device=draft_tokens.device)[None, :] < draft_lens[:, None]
    ok = (draft_tokens == target_argmax[:, :K]) & in_draft
    n_accepted = _first_false(ok)  # [B]
    next_token = target_argmax.gather(1, n_accepted[:, None]).squeeze(1)  # [B]
    return n_accepted, next_token


def verify_sampled(draft_tokens: torch.Tensor, draft_lens: torch.Tensor,
                   draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor,
                   lossy_threshold: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling.

    draft_tokens [B, K], draft_lens [B], draft_probs [B, K, V] (the distributions the drafts
    were drawn from; one-hot for deterministic drafters), target_probs [B, K+1, V],
    accept_uniforms [B, K] and sample_uniforms [B] in [0, 1).
    ``lossy_threshold`` is a fault for the auditor's tests only: accept whenever the target
    probability of the draft exceeds it (what some servers' "acceptance thresholds" do).
    Returns (n_accepted [B], next_token [B]).
    """
    B, K = draft_tokens.shape
    idx = draft_tokens[..., None]  # [B, K, 1]
    target_at_draft = target_probs[:, :K].gather(-1, idx).squeeze(-1)  # [B, K]
    draft_at_draft = draft_probs.gather(-1, idx).squeeze(-1)  # [B, K]
    ratio = target_at_draft / draft_at_draft.clamp_min(1e-30)
    ok = accept_uniforms < ratio.clamp(max=1.0)  # [B, K]
    if lossy_threshold is not None:
        ok = ok | (target_at_draft > lossy_threshold)
    in_draft = torch.arange(K, device=draft_tokens.device)[None, :] < draft_lens[:, None]
    n_accepted = _first_false(ok & in_draft)  # [B]

    rows = torch.arange(B, device=draft_tokens.device)
    target_next = target_probs[rows, n_accepted]  # [B, V]
    rejected = n_accepted < draft_lens  # [B]
    if K > 0:
        draft_next = draft_probs[rows, n_accepted.clamp(max=K - 1)]  # [B, V]
        residual = (target_next - draft_next).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        # A residual of zero mass only happens when target == draft (then nothing is rejected
        # in exact arithmetic); fall back to the target distribution for rounding cases.
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), target_next)
        next_dist = torch.where(rejected[:, None], residual, target_next)  # [B, V]
    else:
        next_dist = target_next
    next_token = sample_from(next_dist, sample_uniforms)
    return n_accepted, next_token
