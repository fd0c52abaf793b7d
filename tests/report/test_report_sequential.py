"""Decisive steps keep their stated error rate: the sequential rule, simulated.

``sequential.critical_values`` is checked against the Brownian motion it assumes (the chance
that any look crosses its boundary is the α it spends). Then whole steps are simulated: two
arms of known speed (``closed_loop.independent``: per-request TPOT around a known median,
workload-like lengths, closed-loop users), measured look by look with the sweep's own
estimators (``summary.figures``) and stopped by the sweep's own rule (``sequential.judge``).
Over several true ratios — clearly ahead, within the even band, A/A, clearly behind — the
intervals at the look each step stopped at must cover the true TPOT and throughput ratios at
the stated 95 % and the verdicts must be wrong at most 5 % of the time. (Monte Carlo slack: with
~600 step-metrics a true 95 % shows as ≥ 93 % all but one time in a thousand.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from closed_loop import Arm, independent, wrong_verdict

from spectest.report import evidence as ev
from spectest.report import sequential
from spectest.sweep.summary import Look, figures


def test_critical_values_spend_exactly_the_alpha_on_a_brownian_motion():
    rng = np.random.default_rng(0)
    for looks in (1, 2, 3, 4, 6):
        c = np.array(sequential.critical_values(looks))
        steps = rng.normal(0, math.sqrt(1 / looks), (400_000, looks))
        t = np.arange(1, looks + 1) / looks
        z = np.cumsum(steps, axis=1) / np.sqrt(t)  # the standardised estimate at each look
        crossed = np.abs(z) >= c
        first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), looks)
        for k in range(looks):  # α spent by look k, as the spending function says
            assert np.mean(first <= k) == pytest.approx(sequential.spent(t[k]), abs=0.0015)
    assert sequential.critical_values(1) == pytest.approx((1.959964,), abs=1e-5)
    # Lan–DeMets Pocock-type boundaries for two looks (published: 2.157, 2.201)
    assert sequential.critical_values(2) == pytest.approx((2.157, 2.201), abs=2e-3)


def test_looks_follow_from_the_cap():
    assert sequential.looks_for(10, None) == 1 and sequential.looks_for(10, 10) == 1
    assert sequential.looks_for(10, 30) == 3 and sequential.looks_for(10, 35) == 3
    assert sequential.looks_for(10, 1000) == sequential.MAX_LOOKS


# per-request TPOT spreads as measured on the bundled engine (docs/sweep-example: the bootstrap
# standard errors of its TPOT medians imply about 0.1 with speculation, 0.05 without)
BASE = Arm(5.0, tpot_sigma=0.06)
CASES = {  # name: speculative arm (the baseline is BASE)
    "clearly ahead": Arm(3.4, tpot_sigma=0.12),
    "a little ahead (inside the even band)": Arm(4.75, tpot_sigma=0.12),
    "the same server (A/A)": BASE,
    "clearly behind": Arm(6.0, tpot_sigma=0.12),
}
STEPS_PER_CASE = 110
LOOKS, SECONDS, C = 3, 10.0, 1


def run_step(rng, spec: Arm) -> sequential.Look:
    looks = {"spec": [], "base": []}
    for k in range(1, LOOKS + 1):
        for arm, model in (("spec", spec), ("base", BASE)):
            req, t1, t2 = independent(rng, model, C, SECONDS)
            looks[arm].append(Look.from_frame(req, t1, t2))
        rows = {arm: figures(v, C) for arm, v in looks.items()}
        look = sequential.judge(rows["spec"], rows["base"], k, LOOKS, C)
        if look.final:
            return look
    raise AssertionError("the rule must stop at the cap")


def test_decisive_steps_cover_at_the_stated_rate_and_are_wrong_no_more_often():
    rng = np.random.default_rng(2024)
    covered = wrong_verdicts = verdicts = total = 0
    stopped_at: dict[str, list[int]] = {}
    for name, spec in CASES.items():
        truth = {"tpot": BASE.tpot_ms / spec.tpot_ms,
                 "throughput": spec.true_rate(C) / BASE.true_rate(C)}
        for _ in range(STEPS_PER_CASE):
            look = run_step(rng, spec)
            stopped_at.setdefault(name, []).append(look.k)
            for metric, r in look.ratios.items():
                total += 1
                covered += r.has_interval and r.low <= truth[metric] <= r.high
                if r.judgement in (ev.AHEAD, ev.BEHIND, ev.EVEN):
                    verdicts += 1
                    wrong_verdicts += wrong_verdict(r.judgement, truth[metric])
    coverage, error_rate = covered / total, wrong_verdicts / total
    print(f"\nsequential rule, {total} step-metrics over {len(CASES)} true ratios, "
          f"{LOOKS} looks: coverage {coverage:.3f}, wrong verdicts {wrong_verdicts} "
          f"({error_rate:.3f}), verdicts given {verdicts}; mean looks per case: "
          + "; ".join(f"{k}: {np.mean(v):.2f}" for k, v in stopped_at.items()))
    assert coverage >= 0.93
    assert error_rate <= 0.05
    # the rule did what it is for: clear steps stop early, close ones use more looks
    assert np.mean(stopped_at["clearly ahead"]) < 1.3
    assert np.mean(stopped_at["a little ahead (inside the even band)"]) > 1.5
