"""The sampled check calibrated against the baseline's own samples (``audit.two_sample``).

Synthetic servers whose scoring route is biased (the logits it reports are the ones it samples
from plus noise, as int8 SmolLM2's echo is against its decode): the one-sample test rejects a
correct candidate there, the two-sample test holds its level; it still catches a shifted
sampler and a top-p applied to the draft only, and judges tokens outside the scoring's support
by their rate against the baseline's own.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectest.audit import distribution as D
from spectest.audit import distribution_check as C
from spectest.audit import two_sample
from spectest.audit.samples import Position

V = 48
SPEC = D.SamplingSpec()  # the audit's defaults: T 0.5, top-p 0.95, top-k 20


def _position(logits: np.ndarray, token: int, n: int = 20) -> Position:
    lp = logits - np.logaddexp.reduce(logits)
    order = np.argsort(-lp, kind="stable")[:n]
    return Position(token, float(lp[token]), tuple((int(i), float(lp[i])) for i in order))


def _arm(rng, prompts=8, samples=6, tokens=12, bias=0.0, sampler=None, spec=SPEC):
    """Sampled continuations of a synthetic server: tokens drawn from the true logits (through
    ``sampler(dist, logits)`` when given, at positions after the first), reported as scored by
    a route that adds ``bias`` × N(0, 1) to every logit."""
    items = []
    for i in range(prompts):
        for k in range(samples):
            for j in range(tokens):
                true = rng.normal(0, 2, V)
                scored = true + bias * rng.normal(0, 1, V)
                dist = D.sampling_dist(_position(true, 0).top, spec)
                if sampler is not None and j:
                    probs = sampler(dist, true)
                    token = int(rng.choice(V, p=probs))
                else:
                    token = int(dist.ids[rng.choice(len(dist.probs), p=dist.probs)])
                items.append(C.Sampled(i, j, token, _position(scored, token), None, k))
    return items


def _toward_argmax(dist, logits):  # TV 0.05 toward the argmax
    probs = np.zeros(V)
    probs[dist.ids] = dist.probs
    top = np.zeros(V)
    top[dist.ids[0]] = 1
    tv = 0.5 * np.abs(probs - top).sum()
    lam = min(1.0, 0.05 / tv) if tv > 0 else 0.0
    return (1 - lam) * probs + lam * top


def _no_top_p(dist, logits):  # top-p not applied: top-k 20 at temperature 0.5 only
    full = D.sampling_dist(_position(logits, 0).top, D.SamplingSpec(0.5, 1.0, 20))
    probs = np.zeros(V)
    probs[full.ids] = full.probs
    return probs


def test_a_biased_scoring_fails_the_one_sample_test_but_not_the_two_sample_one():
    rng = np.random.default_rng(0)
    one, two, p_values = 0, 0, []
    for rep in range(20):
        cand, ctrl = _arm(rng, bias=0.5), _arm(rng, bias=0.5)
        one += not C.check(cand, SPEC, 0.01, 8, rep, 1e-4).passed
        result = C.check(cand, SPEC, 0.01, 8, rep, 1e-4, control=ctrl)
        two += not result.passed
        p_values += [result.pit.p_z, result.pit.p_ks, result.pit.p_cal]
        assert result.pit.method == "two-sample" and result.control is not None
    assert one >= 16  # the scoring's bias alone fails a correct candidate
    assert two <= 1  # alpha 1%: P(>= 2 of 20) = 1.7% if the test holds its level
    assert 0.35 < np.mean(p_values) < 0.65  # permutation p-values roughly uniform


def test_with_an_exact_scoring_both_tests_pass_a_correct_candidate():
    rng = np.random.default_rng(1)
    result = C.check(_arm(rng), SPEC, 0.01, 8, 0, 1e-4, control=_arm(rng))
    assert result.passed and not result.violations
    assert result.control.p_value > 0.01  # the baseline's own tokens fit its scoring


@pytest.mark.parametrize("bias", [0.0, 0.1])
def test_a_shift_of_total_variation_005_is_still_detected(bias):
    rng = np.random.default_rng(2)
    cand = _arm(rng, prompts=16, samples=8, tokens=24, bias=bias, sampler=_toward_argmax)
    ctrl = _arm(rng, prompts=16, samples=8, tokens=24, bias=bias)
    result = C.check(cand, SPEC, 0.01, 16, 0, 1e-4, control=ctrl)
    assert not result.passed
    assert result.pit.z > 2 and result.later.shift_per_token > 0  # sharper than the baseline
    assert "over-chosen at speculated positions" in result.cause()
    assert result.first.pit.p_value > 0.01  # the prefill token is untouched


def test_tokens_outside_the_support_are_judged_by_their_rate_against_the_control():
    rng = np.random.default_rng(3)
    spec = D.SamplingSpec(0.5, 0.8, 20)  # a nucleus that cuts more than the default's
    # the scoring's bias puts some of the baseline's own tokens outside its top-p: no bug
    cand, ctrl = _arm(rng, bias=0.3, spec=spec), _arm(rng, bias=0.3, spec=spec)
    fair = C.check(cand, spec, 0.01, 8, 0, 1e-4, control=ctrl)
    assert fair.violations and fair.control_violations
    assert fair.passed and fair.pit.p_support > 0.01
    assert "against" in fair.reason() and "of its own" in fair.reason()
    # top-p not applied on the candidate: many more tokens outside the nucleus than the baseline
    bad = C.check(_arm(rng, bias=0.3, sampler=_no_top_p, spec=spec), spec, 0.01, 8, 0, 1e-4,
                  control=ctrl)
    assert not bad.passed and bad.pit.p_support < 0.01 / 4
    assert "top-p" in bad.cause()


def test_permutations_keep_each_prompts_number_of_candidate_continuations():
    rng = np.random.default_rng(4)
    arm = np.array([True, True, False, False, True, False, False, False, True])
    stratum = np.array([0, 0, 0, 0, 1, 1, 1, 7, 7])
    perms = two_sample._shuffle_within(arm, stratum, 500, rng)
    for s in np.unique(stratum):
        assert (perms[:, stratum == s].sum(1) == arm[stratum == s].sum()).all()
    # every arrangement inside a stratum occurs: prompt 0 has C(4, 2) = 6
    assert len({tuple(row) for row in perms[:, :4]}) == 6
