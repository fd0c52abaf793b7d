"""The rejection sampler's output follows the target distribution — a G-test with stated error rates.

Setup: synthetic per-position draft and target distributions over V = 12 tokens with K = 3
(draft deliberately different from target: TV ≈ 0.3). We run N = 60,000 independent rounds
through :func:`verify_sampled` and test two things against the *exact* target distributions:
the first emitted token (every round), and the second emitted token in rounds that accepted the
first draft (conditionally it must again follow the target at that position).

Decision rule: G-test (likelihood-ratio chi-square, ``scipy.stats.power_divergence``) at
alpha = 1e-3 per check, so the false-positive rate of this test file is at most 2e-3 with fixed
seeds (it is deterministic: the seeds are fixed, so it either always passes or always fails).
Power: a total-variation shift of 0.02 (0.02 of mass moved between two tokens of probability
~1/12) gives a noncentrality λ = N·Σ(Δ²/p) ≥ 9 at the smallest conditional sample used here;
``test_power_is_stated`` computes the exact power from the noncentral chi-square and asserts it
is ≥ 0.99 for the first-token check. Every injected fault must fail the same test.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from spectest.engine.sampling import probs_from_logits, sample_from
from spectest.engine.verify import verify_greedy, verify_sampled

V, K, N = 12, 3, 60_000
ALPHA = 1e-3


def _dists(seed=0):
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(K + 1, V, generator=gen) * 1.5  # [K+1, V]
    draft_logits = target_logits[:K] + torch.randn(K, V, generator=gen) * 1.2  # [K, V]
    return target_logits, draft_logits


def _run(target_probs, draft_probs, seed=1, lossy=None, greedy=False, target_logits=None):
    """N rounds. target_probs [K+1, V], draft_probs [K, V] → emitted tokens per round."""
    gen = torch.Generator().manual_seed(seed)
    draft_tokens = torch.stack([sample_from(draft_probs[i].expand(N, V), torch.rand(N, generator=gen))
                                for i in range(K)], dim=1)  # [N, K]
    lens = torch.full((N,), K)
    if greedy:
        n_acc, nxt = verify_greedy(draft_tokens, lens, target_logits.expand(N, K + 1, V))
    else:
        n_acc, nxt = verify_sampled(draft_tokens, lens, draft_probs.expand(N, K, V),
                                    target_probs.expand(N, K + 1, V),
                                    torch.rand(N, K, generator=gen), torch.rand(N, generator=gen),
                                    lossy_threshold=lossy)
    first = torch.where(n_acc > 0, draft_tokens[:, 0], nxt)
    second = torch.where(n_acc > 1, draft_tokens[:, 1], nxt)[n_acc > 0]
    return first, second


def g_test(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    observed = torch.bincount(tokens, minlength=V).double()
    expected = probs.double() / probs.double().sum() * len(tokens)
    keep = expected >= 5  # pool sparse cells so the chi-square approximation holds
    obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    if exp[-1] == 0:  # tokens the target gives no mass at all
        if obs[-1] > 0:
            return 0.0
        obs, exp = obs[:-1], exp[:-1]
    if len(exp) == 1:  # a point mass, and nothing was observed off it
        return 1.0
    exp = exp * obs.sum() / exp.sum()  # exact totals (float rounding of probs)
    return float(stats.power_divergence(obs.numpy(), exp.numpy(), lambda_="log-likelihood").pvalue)


def _correct():
    target_logits, draft_logits = _dists()
    temp = torch.tensor([0.8])
    target_probs = probs_from_logits(target_logits[None], temp, torch.tensor([0]),
                                     torch.tensor([1.0]))[0]
    draft_probs = probs_from_logits(draft_logits[None], temp, torch.tensor([0]),
                                    torch.tensor([1.0]))[0]
    return target_logits, draft_logits, target_probs, draft_probs


def test_rejection_sampling_follows_target():
    _, _, target_probs, draft_probs = _correct()
    first, second = _run(target_probs, draft_probs)
    assert g_test(first, target_probs[0]) > ALPHA
    assert g_test(second, target_probs[1]) > ALPHA
    # sanity: the draft alone is far from the target, so the test is not vacuous
    assert 0.5 * (target_probs[0] - draft_probs[0]).abs().sum() > 0.1


def test_top_k_top_p_applied_to_both_sides_is_exact():
    target_logits, draft_logits = _dists(seed=5)
    params = (torch.tensor([1.5]), torch.tensor([6]), torch.tensor([0.9]))
    target_probs = probs_from_logits(target_logits[None], *params)[0]
    draft_probs = probs_from_logits(draft_logits[None], *params)[0]
    first, second = _run(target_probs, draft_probs, seed=7)
    assert g_test(first, target_probs[0]) > ALPHA
    assert g_test(second, target_probs[1]) > ALPHA


def test_draft_equal_target_accepts_everything():
    _, _, target_probs, _ = _correct()
    gen = torch.Generator().manual_seed(3)
    draft_tokens = torch.stack([sample_from(target_probs[i].expand(1000, V),
                                            torch.rand(1000, generator=gen)) for i in range(K)], 1)
    n_acc, _ = verify_sampled(draft_tokens, torch.full((1000,), K),
                              target_probs[:K].expand(1000, K, V),
                              target_probs.expand(1000, K + 1, V),
                              torch.rand(1000, K, generator=gen), torch.rand(1000, generator=gen))
    assert bool((n_acc == K).all())


def test_power_is_stated():
    """Power of the first-token G-test against a TV shift of 0.02, from the noncentral χ²."""
    _, _, target_probs, _ = _correct()
    p = target_probs[0].double()
    a, b = int(p.argmax()), int(p.argsort()[V // 2])
    shifted = p.clone()
    shifted[a] -= 0.02
    shifted[b] += 0.02
    noncentrality = N * float(((shifted - p) ** 2 / p).sum())
    df = V - 1
    critical = stats.chi2.ppf(1 - ALPHA, df)
    power = 1 - stats.ncx2.cdf(critical, df, noncentrality)
    assert power >= 0.99, (noncentrality, power)


# --- each injected fault, emulated exactly as the engine applies it, must fail -------------
def test_fault_greedy_verification_of_sampled_requests_is_detected():
    target_logits, _, target_probs, draft_probs = _correct()
    first, _ = _run(target_probs, draft_probs, greedy=True, target_logits=target_logits)
    assert g_test(first, target_probs[0]) < ALPHA


def test_fault_temperature_on_draft_only_is_detected():
    target_logits, _, target_probs, draft_probs = _correct()
    untempered = target_logits.softmax(-1)  # the target side ignores temperature 0.8
    first, _ = _run(untempered, draft_probs)
    assert g_test(first, target_probs[0]) < ALPHA


def test_fault_top_p_on_draft_only_is_detected():
    target_logits, draft_logits = _dists(seed=5)
    temp, k = torch.tensor([1.0]), torch.tensor([0])
    want = probs_from_logits(target_logits[None], temp, k, torch.tensor([0.6]))[0]
    draft_probs = probs_from_logits(draft_logits[None], temp, k, torch.tensor([0.6]))[0]
    target_no_top_p = probs_from_logits(target_logits[None], temp, k, torch.tensor([1.0]))[0]
    first, _ = _run(target_no_top_p, draft_probs, seed=11)
    assert g_test(first, want[0]) < ALPHA


@pytest.mark.parametrize("threshold", [0.05, 0.1])
def test_fault_lossy_acceptance_threshold_is_detected(threshold):
    _, _, target_probs, draft_probs = _correct()
    first, _ = _run(target_probs, draft_probs, lossy=threshold)
    assert g_test(first, target_probs[0]) < ALPHA
