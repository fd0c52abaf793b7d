"""The auditor's statistics and comparisons on synthetic distributions (no servers).

The sampling transform must equal the engine's; the PIT test must hold its false-positive
rate under the null and reject the shifts the faults produce; KL on the shared support must be
exact when the support is complete and a lower bound otherwise; greedy divergences must be
told apart from ties.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest.audit import distribution as D
from spectest.audit import distribution_check as C
from spectest.audit import greedy
from spectest.audit.logprobs import PositionDiff, Thresholds, check, rank_for, shared_kl
from spectest.audit.noise import NoiseFloor
from spectest.audit.samples import AuditError, Completion, Position, PromptCase, parse_logprobs
from spectest.engine.sampling import probs_from_logits

V = 48


def position(logits: np.ndarray, token: int, n: int = 20) -> Position:
    """What a server reports: the raw logprob of ``token`` and the top-n raw logprobs."""
    lp = logits - np.logaddexp.reduce(logits)
    order = sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:n]
    return Position(token, float(lp[token]), tuple((i, float(lp[i])) for i in order))


def random_logits(rng: np.random.Generator, scale: float = 2.0) -> np.ndarray:
    return rng.normal(0, scale, V)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (0.8, 20, 0.95), (0.5, 20, 1.0), (1.3, 5, 0.9), (1.0, 20, 0.5), (0.7, 1, 1.0)])
def test_sampling_transform_matches_the_engine(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    spec = D.SamplingSpec(temperature, top_p, top_k)
    for _ in range(20):
        logits = random_logits(rng)
        engine = probs_from_logits(torch.tensor(logits)[None, None], torch.tensor([temperature]),
                                   torch.tensor([top_k]), torch.tensor([top_p]))[0, 0].numpy()
        dist = D.sampling_dist(position(logits, 0).top, spec)
        np.testing.assert_allclose(dist.probs, engine[dist.ids], rtol=1e-4, atol=1e-6)
        assert engine[dist.ids].sum() == pytest.approx(1.0, abs=1e-5)  # nothing else possible


def _audit(rng, spec, n, sampler=None, at_first=True):
    """One simulated distribution test of n tokens at positions k % 16 (0 = the prefill token);
    ``sampler(dist, logits) -> probs`` shifts the draws (not at position 0 unless at_first)."""
    items = []
    for k in range(n):
        logits = random_logits(rng)
        dist = D.sampling_dist(position(logits, 0).top, spec)
        shift = sampler is not None and (at_first or k % 16)
        q = sampler(dist, logits) if shift else dist.probs
        token = int(dist.ids[rng.choice(len(q), p=q / q.sum())]) if len(q) == len(dist.ids) \
            else int(rng.choice(V, p=q))
        items.append(C.Sampled(k % 8, k % 16, token, position(logits, token)))
    return C.check(items, spec, 0.01, 8, int(rng.integers(1 << 30)), 1e-4)


def test_false_positive_rate_under_the_null_is_at_most_alpha():
    rng = np.random.default_rng(1)
    spec = D.SamplingSpec()
    results = [_audit(rng, spec, 400) for _ in range(100)]
    rejected = sum(not r.passed for r in results)
    assert rejected <= 4  # alpha = 1%: P(>= 5 of 100) < 0.004 if the test holds its level
    assert all(not r.violations for r in results)
    pz = np.array([r.pit.p_z for r in results])
    assert 0.3 < pz.mean() < 0.7  # p-values roughly uniform


def _toward_argmax(dist, logits):  # TV 0.05 toward the argmax, as greedy-ish bugs do
    r = np.zeros_like(dist.probs)
    r[0] = 1
    tv = 0.5 * np.abs(dist.probs - r).sum()
    lam = min(1.0, 0.05 / tv) if tv > 0 else 0
    return (1 - lam) * dist.probs + lam * r


def test_a_shift_of_total_variation_005_is_detected():
    rng = np.random.default_rng(2)
    spec = D.SamplingSpec()
    results = [_audit(rng, spec, 8000, _toward_argmax) for _ in range(3)]  # ~ a default audit
    assert all(not r.passed for r in results)
    assert all(r.pit.z > 0 and r.later.argmax_share > r.later.argmax_expected for r in results)


def test_temperature_not_applied_is_detected_and_named():
    rng = np.random.default_rng(3)
    spec = D.SamplingSpec(temperature=0.7, top_p=1.0, top_k=20)
    hot = lambda dist, logits: D.sampling_dist(position(logits, 0).top,
                                               D.SamplingSpec(1.0, 1.0, 20)).probs
    r = _audit(rng, spec, 3000, hot)
    assert not r.passed and r.pit.z < 0
    assert r.temperature_fit > 1.1 * r.temperature_reference
    assert "temperature" in r.cause() and "prefill token included" in r.cause()


def test_tokens_outside_top_p_and_top_k_are_violations_and_edges_are_ties():
    spec = D.SamplingSpec(temperature=1.0, top_p=0.6, top_k=3)
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)))
    tail = D.evaluate(0, 1, 2, position(logits, 2), spec, 0.5, 1e-4)  # cut by top-p
    assert isinstance(tail, D.Violation) and tail.reason == "outside top-p"
    out = D.evaluate(0, 1, 3, position(logits, 3), spec, 0.5, 1e-4)  # 4th: outside top-k
    assert isinstance(out, D.Violation) and out.reason == "outside top-k"
    # Within top-3 token 2 starts at mass 0.8/0.95: a nucleus cut just below is a tie.
    edge = D.SamplingSpec(temperature=1.0, top_p=0.8 / 0.95 - 1e-6, top_k=3)
    assert D.evaluate(0, 1, 2, position(logits, 2), edge, 0.5, 1e-4) is None
    one = D.SamplingSpec(temperature=1.0, top_p=0.4, top_k=3)  # one-token support: no info
    assert D.evaluate(0, 1, 0, position(logits, 0), one, 0.5, 1e-4) is None


def test_effective_temperature_recovers_the_sampling_temperature():
    rng = np.random.default_rng(4)
    pairs = []
    for _ in range(3000):
        dist = D.sampling_dist(position(random_logits(rng), 0).top, D.SamplingSpec(0.6, 1, 20))
        pairs.append((dist.raw, int(rng.choice(len(dist.probs), p=dist.probs))))
    assert D.effective_temperature(pairs) == pytest.approx(0.6, rel=0.05)


def test_shared_kl_is_zero_for_equal_and_exact_on_a_complete_support():
    rng = np.random.default_rng(5)
    a, b = random_logits(rng)[:6], random_logits(rng)[:6]
    pa, pb = np.exp(a - np.logaddexp.reduce(a)), np.exp(b - np.logaddexp.reduce(b))
    exact = float((pa * np.log(pa / pb)).sum())
    assert shared_kl(position(a, 0, n=6), position(a, 0, n=6)) == pytest.approx(0, abs=1e-12)
    assert shared_kl(position(a, 0, n=6), position(b, 0, n=6)) == pytest.approx(exact, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 10))
def test_shared_kl_is_a_lower_bound_on_the_full_kl(seed, n):
    rng = np.random.default_rng(seed)
    a, b = random_logits(rng, 3.0), random_logits(rng, 3.0)
    pa, pb = np.exp(a - np.logaddexp.reduce(a)), np.exp(b - np.logaddexp.reduce(b))
    full = float((pa * np.log(pa / pb)).sum())
    assert shared_kl(position(a, 0, n), position(b, 0, n)) <= full + 1e-9


def _completion(tokens, logits_per_step):
    positions = tuple(position(lg, t) for t, lg in zip(tokens, logits_per_step))
    return Completion(tuple(tokens), positions)


def test_greedy_divergence_tie_versus_real_bug_and_its_cause():
    case = PromptCase("p", "code", (1, 2, 3))
    near = np.full(V, -5.0)
    near[[7, 8]] = [2.0, 2.0 - 1e-4]  # a float tie between tokens 7 and 8
    far = np.full(V, -5.0)
    far[[7, 8]] = [2.0, -1.0]
    flat = np.zeros(V)
    base = _completion([5, 7], [flat, near])
    cand = _completion([5, 8], [flat, near])
    scored = (None, None, None, position(flat, 5), position(near, 8))
    d = greedy.compare(case, cand, base, scored, tie_tolerance=0.01, gap_tolerance=0.1)
    assert d.tie and d.index == 1 and d.margin == pytest.approx(1e-4, rel=1e-3)

    # The candidate believed its token was the argmax, the baseline disagrees by 3 nats.
    wrong_state = far.copy()
    wrong_state[8] = 3.0
    cand = _completion([5, 8], [flat, wrong_state])
    scored = (None, None, None, position(flat, 5), position(far, 8))
    d = greedy.compare(case, cand, _completion([5, 7], [flat, far]), scored, 0.01, 0.1)
    assert not d.tie and d.margin == pytest.approx(3.0, rel=1e-6)
    assert "KV-cache" in d.cause and d.self_gap > 2

    # Same distribution on both sides, but the candidate did not pick its own argmax.
    cand = _completion([5, 8], [flat, far])
    d = greedy.compare(case, cand, _completion([5, 7], [flat, far]), scored, 0.01, 0.1)
    assert not d.tie and d.candidate_argmax is False and "verification rule" in d.cause

    first = greedy.compare(case, _completion([8], [far]), _completion([7], [far]),
                           (None, None, None, position(far, 8)), 0.01, 0.1)
    assert first.index == 0 and not first.tie and "prefill" in first.cause
    res = greedy.check([case, case], [_completion([8], [far]), _completion([8], [near])],
                       [_completion([7], [far]), _completion([7], [near])],
                       [(None, None, None, position(far, 8)),
                        (None, None, None, position(near, 8))], 0.01, 0.1)
    assert res.exact == 0 and len(res.ties) == 1 and len(res.failures) == 1 and not res.passed
    assert "real divergence" in res.reason() and "position 1" in res.reason()


def test_logprob_parsing_needs_token_ids_and_logprobs():
    ok = {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [None, -0.5],
          "top_logprobs": [None, {"token_id:7": -0.5, "token_id:2": -1.5}]}
    parsed = parse_logprobs(ok, "the baseline", 2, skip_first_none=True)
    assert parsed[0] is None and parsed[1] == Position(7, -0.5, ((7, -0.5), (2, -1.5)))
    with pytest.raises(AuditError, match="return_tokens_as_token_ids"):
        parse_logprobs({**ok, "tokens": ["hello", "token_id:7"]}, "the candidate", 2, True)
    with pytest.raises(AuditError, match="returned no logprobs"):
        parse_logprobs(None, "the candidate", 2)
    with pytest.raises(AuditError, match="returned 2 top logprobs where 5"):
        parse_logprobs(ok, "the candidate", 5, True)
    assert math.isfinite(parsed[1].logprob)


def _toward_mid(dist, logits):  # TV 0.05 into 0.1 <= p < 0.4, what a lossy threshold does
    r = np.where((dist.probs >= 0.1) & (dist.probs < 0.4), dist.probs, 0)
    if r.sum() == 0:
        return dist.probs
    r /= r.sum()
    tv = 0.5 * np.abs(dist.probs - r).sum()
    lam = min(1.0, 0.05 / tv) if tv > 0 else 0
    return (1 - lam) * dist.probs + lam * r


def test_a_lossy_threshold_shift_is_caught_by_the_calibration_statistic():
    rng = np.random.default_rng(6)
    r = _audit(rng, D.SamplingSpec(), 8000, _toward_mid, at_first=False)
    assert not r.passed and r.pit.p_cal < 1e-4 and r.pit.p_cal < r.pit.p_z
    cal = r.later.pit.calibration
    assert max(cal.z) == max(cal.z[3], cal.z[4])  # the 0.1-0.2 or 0.2-0.4 bin
    assert "over-chosen at speculated positions" in r.cause() and "lossy" in r.cause()


def _diffs(kls):
    return [PositionDiff("p", i, 0, kl, kl, False, True) for i, kl in enumerate(kls)]


def test_a_maximum_widened_to_the_floor_is_judged_at_the_floors_sample_size():
    floor = NoiseFloor(positions=96, max_abs_logprob=0.3, mean_kl=0.01, max_kl=0.075,
                       top1_disagreement=0.0, p95_kl=0.03)
    widened, _ = floor.widen(Thresholds(), tie_tolerance=0.01)
    assert (widened.max_kl, widened.max_kl_over) == (0.15, 96)
    assert (widened.max_abs_logprob, widened.max_abs_logprob_over) == (0.6, 96)
    # 480 positions against a floor over 96: the 5th largest stands for the floor's maximum
    four_high = _diffs([0.2] * 4 + [0.01] * 476)
    assert rank_for(480, 96) == 5 and check(four_high, widened).passed
    # a pass whose plain maximum is above the tolerance says what it was judged by
    assert "max KL 0.2" in check(four_high, widened).reason()
    assert ("judged by the 5-th largest KL, 0.01" in check(four_high, widened).reason()
            and "noise floor's 96 positions" in check(four_high, widened).reason())
    five_high = _diffs([0.2] * 5 + [0.01] * 475)
    assert not check(five_high, widened).passed
    assert "5-th largest" in check(five_high, widened).reason()
    # the same number of positions as the floor: the plain maximum, as before
    assert not check(_diffs([0.2] + [0.01] * 95), widened).passed
    # a configured tolerance the floor did not raise stays a plain maximum
    strict, _ = floor.widen(Thresholds(max_kl=1.0, max_abs_logprob=5.0), tie_tolerance=0.01)
    assert (strict.max_kl_over, strict.max_abs_logprob_over) == (0, 0)
    assert not check(_diffs([1.5] + [0.01] * 479), strict).passed
