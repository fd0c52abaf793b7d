"""Sampling parameters and the pure logits → probabilities transform shared by draft and target.

Owns: :class:`SamplingParams` and :func:`probs_from_logits`, which applies temperature, min-p,
top-k and top-p per row (in vLLM's order). The speculative engine calls the *same* function with
the *same* per-row parameters for the draft and for the target; that is what keeps rejection
sampling exact. The parameters that depend on the tokens so far — ``logit_bias`` and the
presence / frequency / repetition penalties — are applied to the logits before this, per
position, by ``engine.penalties``.

Does not know: models, caches or requests. Random draws are made by the caller from per-request
generators (:func:`uniforms`) so a sampled run is reproducible from its seed alone, whatever
else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_p: float = 0.0  # in [0, 1]: drop tokens below min_p × the most likely one's probability
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # > 0; divides (multiplies) the positive (negative) logits
    # of every token in the prompt or the output; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    def __post_init__(self):
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError("top_k must be -1, 0 or positive")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def penalized(self) -> bool:
        """Does the row's distribution depend on its tokens so far (``engine.penalties``)?"""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        # vLLM's rule: below 1e-5 a float32 temperature underflows the softmax; treat as greedy
        return self.temperature < 1e-5


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row sampling distribution.

    logits [B, T, V]; temperature [B] (> 0), top_k [B] (<= 0 = off), top_p [B] in (0, 1],
    min_p [B] in [0, 1] (None or 0 = off). Returns probs [B, T, V] in float32 that sum to 1
    over V. vLLM's order: temperature, then min-p (tokens whose probability is below min_p ×
    the largest are dropped), then top-k and top-p on what is left. Truncation keeps every
    token whose logit ties the k-th largest (so the result does not depend on sort order at
    ties) and the smallest prefix of the sorted distribution whose mass reaches top_p.
    """
    logits = logits.float() / temperature[:, None, None]  # [B, T, V]
    if min_p is not None and bool((min_p > 0).any()):
        probs = logits.softmax(-1)  # [B, T, V]
        floor = probs.amax(-1, keepdim=True) * min_p[:, None, None]  # [B, T, 1]
        logits = logits.masked_fill(probs < floor, float("-inf"))
    use_k = bool((top_k > 0).any())
    use_p = bool((top_p < 1).any())
    if use_k or use_p:
        sorted_logits, _ = logits.sort(dim=-1, descending=True)  # [B, T, V]
        V = logits.shape[-1]
        keep_floor = sorted_logits[..., -1:].clone()  # [B, T, 1] minimum logit: keeps all
        if use_k:
            k = torch.where(top_k > 0, top_k.clamp(max=V), V)  # [B]
            kth = sorted_logits.gather(-1, (k - 1)[:, None, None].expand(-1, logits.shape[1], 1))
            keep_floor = torch.maximum(keep_floor, kth)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
        if use_p:
            sorted_probs = sorted_logits.softmax(-1)  # [B, T, V]
            mass_before = sorted_probs.cumsum(-1) - sorted_probs
            cut = mass_before >= top_p[:, None, None]  # tokens entirely past the nucleus
            cut[..., 0] = False
            last_kept = (~cut).sum(-1, keepdim=True) - 1  # [B, T, 1]
            pth = sorted_logits.gather(-1, last_kept)
            keep_floor = torch.maximum(keep_floor, pth)
        logits = logits.masked_fill(logits < keep_floor, float("-inf"))
    return logits.softmax(-1)


def sample_from(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [N, V], uniform [N] in [0, 1) → token ids [N]."""
    cdf = probs.cumsum(-1)  # [N, V]
    u = uniform[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(-1)


def uniforms(generators: list[torch.Generator | None], n: int) -> torch.Tensor:
    """[B, n] uniforms, row b drawn from ``generators[b]`` (the global RNG when None)."""
    return torch.stack([torch.rand(n, generator=g) for g in generators])


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
    return gen
