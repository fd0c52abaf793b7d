"""Through the whole engine: sampled speculative output follows the target distribution.

Tiny random target and draft (different weights) over an 8-token vocabulary, temperature 0.6
and top-p 0.8 on both sides, K = 2, max_tokens = 4. The first token comes from the prefill; the
second and third come from the first speculative round (drafted, accepted or resampled, bonus).
For each observed prefix we compute the exact target distribution with the same
temperature/top-p, and pool a G-test over prefixes (sum of per-prefix G statistics, χ² with the
summed degrees of freedom) at alpha = 1e-3. Seeds are fixed, so the test is deterministic; its
false-positive rate as a procedure is 1e-3 per check. Each injected fault must fail it.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams, probs_from_logits

from pairs import pooled_pvalue, make_engine, random_eagle, tiny_model, tiny_tokenizer

V, N, ALPHA = 8, 2500, 1e-3
PROMPT = (1, 2, 3)
TEMPERATURE, TOP_P = 0.6, 0.8


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_model(V, seed=0, scale=0.6), tiny_model(V, seed=1, scale=0.6), tiny_tokenizer(V)


def _sample(models, faults=frozenset(), n=N, drafter="draft-model", records=None):
    target, draft, tok = models
    engine = make_engine(target, tok, drafter, draft, FixedK(2), max_num_seqs=32,
                         faults=faults)
    if records is not None:
        engine.observers.append(records.append)
    outs = defaultdict(list)
    for i in range(n):
        req = GenerationRequest(f"r{i}", PROMPT, SamplingParams(
            max_tokens=4, temperature=TEMPERATURE, top_p=TOP_P, seed=i, ignore_eos=True))
        engine.submit(req, lambda o: outs[o.request_id].extend(o.token_ids))
    engine.run_until_idle()
    return [outs[f"r{i}"] for i in range(n)]


@torch.no_grad()
def _target_dist(target, prefix):
    logits = target(torch.tensor([list(PROMPT) + list(prefix)]))[:, -1:]  # [1, 1, V]
    return probs_from_logits(logits, torch.tensor([TEMPERATURE]), torch.tensor([0]),
                             torch.tensor([TOP_P]))[0, 0].double()


def _pooled_pvalue(target, sequences, position) -> float:
    return pooled_pvalue(lambda prefix: _target_dist(target, prefix), sequences, position, V)


def test_speculative_sampling_matches_target(models):
    sequences = _sample(models)
    assert _pooled_pvalue(models[0], sequences, 1) > ALPHA
    assert _pooled_pvalue(models[0], sequences, 2) > ALPHA


def test_sampled_runs_reproduce_from_seed(models):
    first = _sample(models, n=200)
    assert first == _sample(models, n=200)
    assert len({tuple(s) for s in first}) > 5  # and they are not all the same


@pytest.mark.parametrize("fault", ["greedy-verify-sampled", "draft-only-temperature",
                                   "draft-only-top-p", "lossy-threshold"])
def test_each_fault_is_detected(models, fault):
    sequences = _sample(models, frozenset({fault}))
    p = min(_pooled_pvalue(models[0], sequences, 1), _pooled_pvalue(models[0], sequences, 2))
    assert p < ALPHA, f"{fault} not detected (p = {p:.3g})"


def test_a_draft_head_cut_to_some_tokens_keeps_sampling_exact(models):
    """A draft that drafts over 4 of the 8 tokens (``restrict_head``): it never proposes the
    others, gives them probability 0, and the output still follows the target's distribution
    (same pooled G-test, alpha = 1e-3)."""
    import copy

    from spectest.engine.drafters import DraftModelDrafter, DraftRow
    from spectest.engine.model import restrict_head
    target, draft, tok = models
    cut = restrict_head(copy.deepcopy(draft), (0, 2, 3, 5))
    drafter = DraftModelDrafter(cut, n_slots=1, max_len=16)
    drafter.admit(0, list(PROMPT))
    params = SamplingParams(temperature=TEMPERATURE, top_p=TOP_P)
    proposal = drafter.propose([DraftRow(0, list(PROMPT), 3, params, torch.rand(3))])
    assert set(proposal.tokens[0].tolist()) <= {0, 2, 3, 5}
    assert proposal.probs.shape == (1, 3, V)
    assert float(proposal.probs[0][:, [1, 4, 6, 7]].abs().sum()) == 0.0
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(1, 3))
    sequences = _sample((target, cut, tok))
    assert _pooled_pvalue(target, sequences, 1) > ALPHA
    assert _pooled_pvalue(target, sequences, 2) > ALPHA


def test_an_eagle_head_keeps_sampling_exact(models):
    """An EAGLE head (random, drafting over 5 of the 8 tokens from the target's hidden
    states): the output follows the target's distribution (same pooled G-test, alpha = 1e-3)."""
    target, _, tok = models
    drafter = random_eagle(target, seed=3, scale=0.5, head_ids=(0, 1, 2, 4, 6), n_slots=32,
                           max_len=16)
    records = []
    sequences = _sample(models, drafter=drafter, records=records)
    assert _pooled_pvalue(target, sequences, 1) > ALPHA
    assert _pooled_pvalue(target, sequences, 2) > ALPHA
    rows = [row for rec in records for row in rec.rows if row.k_proposed]
    assert len(rows) > N / 2  # it drafted, and some drafts were accepted, some not
    assert 0 < sum(row.accepted for row in rows) < sum(row.k_proposed for row in rows)


def test_prompt_lookup_with_a_model_fallback_keeps_sampling_exact(models):
    """``ngram+draft-model``: rows whose suffix recurs get one-hot n-gram drafts, the others the
    model's distributions, in one proposal; the output still follows the target's distribution
    (same pooled G-test, alpha = 1e-3), and both halves drafted."""
    from spectest.engine.drafters import DraftModelDrafter, HybridDrafter, NGramDrafter
    target, draft, tok = models
    lookup = NGramDrafter(4, 1)
    found = []
    real_lookup = lookup.lookup
    lookup.lookup = lambda tokens, k: found.append(bool(real_lookup(tokens, k))) or \
        real_lookup(tokens, k)
    drafter = HybridDrafter(lookup, DraftModelDrafter(draft, 32, 16))
    sequences = _sample(models, drafter=drafter)
    assert _pooled_pvalue(target, sequences, 1) > ALPHA
    assert _pooled_pvalue(target, sequences, 2) > ALPHA
    assert 0.1 < sum(found) / len(found) < 0.9  # both halves drafted


def test_prompt_lookup_in_front_of_an_eagle_head_keeps_sampling_exact(models):
    """``ngram+eagle`` with the head capped below the round's K (as SmolLM2 runs it): the head
    skips the rounds the lookup drafts and catches up on its features; the output follows the
    target's distribution (same pooled G-test, alpha = 1e-3)."""
    from spectest.engine.drafters import HybridDrafter, NGramDrafter
    target, _, tok = models
    eagle = random_eagle(target, seed=3, scale=0.5, head_ids=(0, 1, 2, 4, 6), n_slots=32,
                         max_len=16)
    records = []
    sequences = _sample(models, drafter=HybridDrafter(NGramDrafter(4, 1), eagle, model_k=1),
                        records=records)
    assert _pooled_pvalue(target, sequences, 1) > ALPHA
    assert _pooled_pvalue(target, sequences, 2) > ALPHA
    proposed = {row.k_proposed for rec in records for row in rec.rows}
    assert {1, 2} <= proposed  # head rounds of 1, lookup rounds of 2
