"""What the generation-scoring route (no echo: llama.cpp) cannot know, and how the checks treat
it: the baseline reports only its top-n, so a sampled token ranked past it has no baseline
logprob. Not measured is not zero: the logprob difference is left out (and counted), and in the
distribution test a token within the noise of the baseline's top-k edge is a tie, not a token
outside the support."""

import math

from spectest.audit import distribution_check, logprobs
from spectest.audit.distribution import SamplingSpec
from spectest.audit.samples import Position

TOP = tuple((100 + i, -1.0 - 0.25 * i) for i in range(20))  # the baseline's top-20, id 100..119
EDGE = TOP[-1][1]  # -5.75: its 20th logprob
SPEC = SamplingSpec(temperature=0.7, top_p=1.0, top_k=20, order="temperature-last")


def sampled(token: int, own_logprob: float) -> distribution_check.Sampled:
    scored = Position(token, -math.inf, TOP)  # past the baseline's reported top-20
    own = Position(token, own_logprob, ((100, -1.0), (token, own_logprob)))
    return distribution_check.Sampled(0, 3, token, scored, own)


def test_an_unreported_token_has_no_logprob_difference_but_keeps_its_kl():
    cand = Position(7, -6.0, ((100, -1.0), (7, -6.0)))
    base = Position(7, -math.inf, TOP)
    diff = logprobs.compare("p", 3, cand, base, 0.1)
    assert diff.unmeasured and diff.abs_diff == 0.0 and math.isfinite(diff.kl)
    known = logprobs.compare("p", 3, cand, Position(7, -5.9, TOP), 0.1)
    assert not known.unmeasured and abs(known.abs_diff - 0.1) < 1e-9


def test_a_token_just_past_the_edge_is_a_tie_within_the_noise():
    near = sampled(7, EDGE - 0.2)  # the candidate ranks it where the baseline's edge is
    strict = distribution_check.check([near], SPEC, 0.01, 1, 0, 1e-4)
    assert len(strict.violations) == 1  # without a noise allowance: outside the support
    noisy = distribution_check.check([near], SPEC, 0.01, 1, 0, 1e-4, edge_noise=0.5)
    assert not noisy.violations and noisy.skipped == 1


def test_a_token_far_past_the_edge_is_still_outside_the_support():
    far = sampled(7, EDGE - 3.0)
    result = distribution_check.check([far], SPEC, 0.01, 1, 0, 1e-4, edge_noise=0.5)
    assert len(result.violations) == 1
