"""Model Equality Testing's MMD test (``audit.mmd``): its false-positive rate is at most alpha,
it detects a sharper sampler, and it knows the paper's statistic on a hand-worked case."""

from __future__ import annotations

import numpy as np
import pytest

from spectest.audit import mmd

V, L = 6, 12


def _samples(rng, shift: float, prompts: int = 12, k: int = 6):
    """k completions per prompt from per-prompt position-wise distributions p^(1 + shift)."""
    out = []
    for prompt in range(prompts):
        base = np.random.default_rng(prompt).dirichlet(np.full(V, 0.5), size=L)
        probs = base ** (1 + shift)
        probs /= probs.sum(1, keepdims=True)
        for _ in range(k):
            out.append((prompt, [int(rng.choice(V, p=p)) for p in probs]))
    return out


def test_the_statistic_is_the_unbiased_mmd_with_the_prompt_indicator_hamming_kernel():
    cand = [(0, [1, 2]), (0, [1, 3])]
    base = [(0, [4, 4]), (0, [4, 2]), (1, [1, 2])]
    # k(x, x') = 1[prompt] * share of equal positions; U-statistic means over a != a'
    xx = (0.5 + 0.5) / (2 * 1)  # cand pairs: [1,2]-[1,3] agree at 1 of 2
    yy = (0.5 + 0.5 + 0 + 0 + 0 + 0) / (3 * 2)  # base: [4,4]-[4,2] 0.5; prompt 1 apart
    xy = (0 + 0.5 + 0 + 0 + 0 + 0) / (2 * 3)  # [1,2]-[4,2] 0.5 only (same prompt)
    got = mmd.test(cand, base, 2, permutations=9)
    assert got.mmd2 == pytest.approx(xx + yy - 2 * xy)


def test_false_positive_rate_is_at_most_alpha_and_a_shift_is_detected():
    rng = np.random.default_rng(0)
    null = [mmd.test(_samples(rng, 0.0), _samples(rng, 0.0), L, seed=i, permutations=199)
            for i in range(40)]
    rejected = sum(r.p_value < 0.1 for r in null)
    assert rejected <= 10  # alpha 0.1 over 40: at most 10 with probability > 0.99
    shifted = [mmd.test(_samples(rng, 2.0), _samples(rng, 0.0), L, seed=i, permutations=199)
               for i in range(10)]
    assert sum(r.p_value < 0.05 for r in shifted) >= 8


def test_padding_and_too_few_samples():
    assert mmd.padded([5, 6], 4).tolist() == [5, 6, mmd.PAD, mmd.PAD]
    assert mmd.test([(0, [1])], [(0, [1]), (0, [2])], 2).p_value == 1.0
