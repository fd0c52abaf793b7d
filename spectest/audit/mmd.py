"""Model Equality Testing's test: an MMD two-sample test over whole completions.

Owns: :func:`test`, the kernel two-sample test of Gao, Liang and Guestrin ("Model Equality
Testing: Which Model Is This API Serving?", ICLR 2025), written from the paper for spectest.

The data are (prompt, completion) pairs from each server: completion y is a token sequence cut
or padded to L tokens. The kernel is the product of an indicator on the prompt and the Hamming
similarity of the completions,

    k((x, y), (x', y')) = 1[x = x'] · (1/L) Σ_l 1[y_l = y'_l],

and the statistic is the unbiased estimate of the squared maximum mean discrepancy between the
candidate's joint distribution of (prompt, completion) and the baseline's,

    MMD² = mean_{a≠a'} k(X_a, X_a') + mean_{b≠b'} k(Y_b, Y_b') − 2 mean_{a,b} k(X_a, Y_b).

Under H0 (same distribution of completions given every prompt) the candidate's and the
baseline's completions of a prompt are exchangeable, so relabelling them within each prompt is
an exact permutation test: p = (1 + #{permuted ≥ observed}) / (1 + permutations). The paper
simulates its null instead by drawing more samples from a local copy of the reference model;
a server under audit is not such a copy, and the permutation test needs no samples beyond the
two arms. It needs no logprobs and no model of the server's sampler: any setting (penalties,
``logit_bias``, ``n``, ``min_p``) and any server can be compared. The price is power: it sees
only how often the two servers' completions agree token by token, not how likely each token
was; ``benchmarks/mmd_power.py`` measures both tests at equal sample budgets.

Does not know: HTTP, prompts as text or report files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAD = -1  # a position past a completion's end (it matches another completion's padding)
PERMUTATIONS = 1999


@dataclass(frozen=True)
class MmdResult:
    mmd2: float  # the observed unbiased MMD² (can be < 0 under H0)
    p_value: float
    candidates: int  # completions per arm
    baselines: int
    prompts: int
    length: int  # L
    permutations: int

    def reason(self) -> str:
        return (f"MMD² {self.mmd2:.4g} over {self.candidates} + {self.baselines} completions "
                f"of {self.prompts} prompts (Hamming kernel, L = {self.length}), p = "
                f"{self.p_value:.3g} ({self.permutations} permutations within prompts)")


def padded(tokens: Sequence[int], length: int) -> np.ndarray:
    out = np.full(length, PAD, dtype=np.int64)
    cut = list(tokens)[:length]
    out[:len(cut)] = cut
    return out


def test(cand: Sequence[tuple[int, Sequence[int]]], base: Sequence[tuple[int, Sequence[int]]],
         length: int, seed: int = 0, permutations: int = PERMUTATIONS) -> MmdResult:
    """``cand`` / ``base``: (prompt index, completion tokens) pairs of each server."""
    prompts = sorted({p for p, _ in cand} | {p for p, _ in base})
    n, m = len(cand), len(base)
    if n < 2 or m < 2:
        return MmdResult(0.0, 1.0, n, m, len(prompts), length, 0)
    blocks = []  # per prompt: the pooled completions' Gram matrix and who is a candidate
    for prompt in prompts:
        rows = [padded(y, length) for p, y in cand if p == prompt] + \
            [padded(y, length) for p, y in base if p == prompt]
        arm = np.array([True] * sum(p == prompt for p, _ in cand)
                       + [False] * sum(p == prompt for p, _ in base))
        ys = np.stack(rows)  # [k, L]
        gram = (ys[:, None, :] == ys[None, :, :]).mean(-1)  # [k, k] Hamming similarity
        np.fill_diagonal(gram, 0.0)  # the U-statistic leaves out a == a'
        blocks.append((gram, arm))

    def stat(labels: list[np.ndarray]) -> np.ndarray:
        """labels: per prompt [R, k] bool (True = candidate) → MMD² [R]."""
        xx = yy = xy = 0.0
        for (gram, _), z in zip(blocks, labels):
            c, b = z.astype(np.float64), (~z).astype(np.float64)  # [R, k]
            xx = xx + np.einsum("ri,ij,rj->r", c, gram, c)
            yy = yy + np.einsum("ri,ij,rj->r", b, gram, b)
            xy = xy + np.einsum("ri,ij,rj->r", c, gram, b)
        return xx / (n * (n - 1)) + yy / (m * (m - 1)) - 2 * xy / (n * m)

    observed = float(stat([arm[None] for _, arm in blocks])[0])
    rng = np.random.default_rng(seed)
    exceed, done = 0, 0
    while done < permutations:
        r = min(256, permutations - done)
        shuffled = [np.take_along_axis(np.broadcast_to(arm, (r, len(arm))),
                                       rng.random((r, len(arm))).argsort(1), 1)
                    for _, arm in blocks]
        exceed += int((stat(shuffled) >= observed - 1e-12).sum())
        done += r
    return MmdResult(observed, (1 + exceed) / (1 + permutations), n, m, len(prompts), length,
                     permutations)
