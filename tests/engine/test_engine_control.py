"""The runtime speculation switch (``engine.control``): changes land at a round boundary, a
switched-off engine decodes target-only without touching the drafter, and greedy output stays
the target-only output through flips in the middle of requests — off, on with another K,
another policy — for both drafters.

Also: the control's validation (K bounds, policy names, goodput without a profile, no drafter),
superseded and no-op requests, and the draft model's catch-up after it sat out many tokens
(its proposals equal a freshly prefilled draft's, and a lagging row next to a row at the end
of its context does not overflow the draft cache).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spectest.engine.control import (PolicyOptions, SettingError, SpeculationControl,
                                     SpeculationSettings, control_for)
from spectest.engine.drafters import DraftModelDrafter, DraftRow
from spectest.engine.policies import AdaptiveK, DisableAbove, FixedK
from spectest.engine.sampling import SamplingParams

from pairs import make_engine
from test_engine_greedy import _compare, _requests


@pytest.fixture(scope="module")
def pair():
    from pairs import load_embedded
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_embedded()
    torch.set_num_threads(threads)


# (round index at which the change is requested, change) — the engine applies each at the
# start of the next step, while every request is mid-flight
FLIPS = ((3, dict(enabled=False)), (7, dict(enabled=True, k=2)), (11, dict(k_policy="adaptive")),
         (14, dict(enabled=False)), (17, dict(enabled=True, k=4, k_policy="fixed")))


def _run_with_flips(engine, requests, flips):
    out = {r.request_id: [] for r in requests}
    records = []
    engine.add_observer(records.append)
    for r in requests:
        engine.submit(r, lambda o: out[o.request_id].extend(o.token_ids))
    todo = list(flips)
    while True:
        while todo and engine.rounds >= todo[0][0]:
            engine.control.request(**todo.pop(0)[1])
        if not engine.step():
            break
    return [out[r.request_id] for r in requests], records


@pytest.mark.parametrize("drafter", ["draft-model", "ngram"])
def test_greedy_output_is_unchanged_by_flips_mid_request(pair, drafter):
    target, draft = pair
    # long enough, and past EOS, that every request is still running at the last flip
    reqs = [replace(r, params=replace(r.params, ignore_eos=True))
            for r in _requests(target.tokenizer, [56, 48, 44, 52])]
    base_engine = make_engine(target.model, target.tokenizer, "none", max_num_seqs=4)
    base, _ = _run_with_flips(base_engine, reqs, ())
    engine = make_engine(target.model, target.tokenizer, drafter, draft.model, FixedK(4),
                         max_num_seqs=4)
    spec, records = _run_with_flips(engine, reqs, FLIPS)
    ties = _compare(pair, reqs, spec, base)
    assert ties <= 1, f"{ties} ties"
    by_round = {r.index: r for r in records}
    off = [i for i in by_round if 3 <= i < 7 or 14 <= i < 17]
    assert off and all(row.k_proposed == 0 for i in off for row in by_round[i].rows)
    assert all(by_round[i].decision.startswith("speculation switched off") for i in off)
    assert all(by_round[i].k == 2 for i in range(7, 11) if i in by_round)
    assert any(row.k_proposed for i in range(7, 11) if i in by_round
               for row in by_round[i].rows), "drafting did not resume"
    assert engine.control.settings() == SpeculationSettings(True, 4, "fixed")
    assert engine.control.switches == len(FLIPS)
    assert isinstance(engine.policy, FixedK) and engine.policy.k == 4


class _Spy:
    """A drafter wrapper that counts calls."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, []

    def __getattr__(self, attr):
        fn = getattr(self.inner, attr)

        def record(*args, **kw):
            self.calls.append(attr)
            return fn(*args, **kw)
        return record


def test_switched_off_engine_never_drafts_nor_prefills_the_draft(pair):
    target, draft = pair
    engine = make_engine(target.model, target.tokenizer, "draft-model", draft.model,
                         FixedK(4), max_num_seqs=2)
    spy = engine.drafter = _Spy(engine.drafter)
    engine.control.request(enabled=False)
    outputs, records = _run_with_flips(engine, _requests(target.tokenizer, [12, 9]), ())
    assert all(outputs)
    assert "propose" not in spy.calls and "admit" not in spy.calls
    assert all(row.k_proposed == 0 for rec in records for row in rec.rows)
    assert {rec.k for rec in records} == {0}


def test_catch_up_equals_a_fresh_prefill_and_does_not_overflow(pair):
    """A row 40 tokens behind next to a row one token from the end of its context."""
    target, draft = pair
    max_len = 96
    tokens = [int(t) for t in torch.randint(5, 500, (80,), generator=torch.Generator()
                                            .manual_seed(1))]
    long_row = [int(t) for t in torch.randint(5, 500, (max_len - 6,),
                                              generator=torch.Generator().manual_seed(2))]
    lagging = DraftModelDrafter(draft.model, 2, max_len)
    lagging.admit(0, tokens[:40])  # saw the first 40, then sat out 40 tokens
    lagging.admit(1, long_row)
    fresh = DraftModelDrafter(draft.model, 2, max_len)
    fresh.admit(0, tokens)
    rows = [DraftRow(0, tokens, 4, SamplingParams()), DraftRow(1, long_row, 4, SamplingParams())]
    got = lagging.propose(rows)
    want = fresh.propose(rows[:1])
    assert got.tokens[0].tolist() == want.tokens[0].tolist()
    assert int(lagging.cache.lengths[0]) == int(fresh.cache.lengths[0])


def _control(k_limit=6, can_draft=True, profile=None):
    return SpeculationControl(SpeculationSettings(True, 4, "fixed"),
                              PolicyOptions(k_max=k_limit, profile=profile).build, k_limit,
                              can_draft)


@pytest.mark.parametrize("change, field", [
    (dict(k=0), "k"), (dict(k=7), "k"), (dict(k_policy="nope"), "k_policy"),
    (dict(k_policy="goodput"), "k_policy")])
def test_control_refuses_what_the_engine_cannot_take(change, field):
    control = _control()
    with pytest.raises(SettingError) as err:
        control.request(**change)
    assert err.value.field == field
    assert control.pending() is None and control.settings().k == 4


def test_no_drafter_means_off_and_cannot_be_switched_on():
    control = _control(can_draft=False)
    assert control.settings().enabled is False
    with pytest.raises(SettingError):
        control.request(enabled=True)
    assert control.request(enabled=False).applied_at is not None  # a no-op


def test_changes_merge_until_the_round_boundary_and_no_ops_do_not_count():
    control = _control()
    seen = []
    control.listeners.append(seen.append)
    first = control.request(enabled=False)
    second = control.request(k=2)
    assert control.change(first.version) is None  # pending
    assert control.pending().new == SpeculationSettings(False, 2, "fixed")
    applied = control.apply(round_index=5)
    assert control.change(first.version) is applied and applied.version == second.version
    assert applied.round == 5 and applied.effective_after_s >= 0 and applied.changed
    assert isinstance(applied.policy, FixedK) and applied.policy.k == 2
    assert control.apply(6) is None and seen == [applied]
    noop = control.request(enabled=False, k=2)
    assert noop.applied_at is not None and not noop.changed and control.pending() is None
    control.request(enabled=True)
    back = control.apply(7)
    assert back.policy is None  # same K and policy: the engine keeps its policy (and state)
    assert control.switches == 2


def test_control_for_a_start_up_policy_keeps_its_bounds():
    control = control_for(DisableAbove(AdaptiveK(k_init=3, k_max=6), 4), k_limit=6)
    assert control.settings() == SpeculationSettings(True, 3, "adaptive")
    control.request(k=5, k_policy="adaptive")
    policy = control.apply(0).policy
    assert isinstance(policy, DisableAbove) and policy.max_batch == 4
    assert policy.inner.k == 5 and policy.inner.k_max == 6
