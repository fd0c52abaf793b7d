"""Greedy speculative output equals greedy target-only output, token for token.

For the draft-model and n-gram drafters, every K policy, at batch 1 and in a continuous batch
where requests join and leave mid-run with different lengths. A difference is tolerated only at
a floating-point tie — the target's top-2 logit margin below 1e-4 at the first differing
position, measured by a fresh target forward — and such ties are counted and reported.
"""

from __future__ import annotations

import uuid

import pytest
import torch

from spectest.engine.policies import (AdaptiveK, ConfidenceK, DisableAbove, FixedK, GoodputK,
                                      Profile)
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine

PROMPTS = [
    "def binary_search(items, target):\n    lo, hi = 0, len(items)\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "The :mod:`json` module can be used to",
    "<|im_start|>user\nExplain list comprehensions.<|im_end|>\n<|im_start|>assistant\n",
    "class Stack:\n    \"\"\"A last-in first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "Answer the question using the context.\n\nContext:\nThe tuple is an immutable sequence."
    " Tuples are written with parentheses.\n\nQuestion: How are tuples written?",
]
TIE_MARGIN = 1e-4


def _profile():
    return Profile({1: {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4},
                    4: {0: 1.2, 1: 1.5, 2: 1.9, 3: 2.4, 4: 3.0}},
                   (0.8, 0.6, 0.45, 0.3))


POLICIES = {
    "fixed-4": lambda: FixedK(4),
    "fixed-1": lambda: FixedK(1),
    "adaptive": lambda: AdaptiveK(k_init=2, k_min=1, k_max=6, window=8),
    "confidence": lambda: ConfidenceK(k_max=6, threshold=0.4),
    "goodput": lambda: GoodputK(_profile(), k_max=4),
    "disable-above-2": lambda: DisableAbove(FixedK(3), 2),
}


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: one thread is faster, and immune to busy cores
    yield load_embedded()
    torch.set_num_threads(threads)


def _requests(tokenizer, max_tokens):
    return [GenerationRequest(uuid.uuid4().hex, tuple(tokenizer.encode(p)),
                              SamplingParams(max_tokens=m))
            for p, m in zip(PROMPTS, max_tokens)]


def _run(engine, requests, join_every=0):
    """Submit requests (all at once, or one every ``join_every`` rounds) and collect tokens."""
    out = {r.request_id: [] for r in requests}
    pending = list(requests)

    def submit_one():
        r = pending.pop(0)
        engine.submit(r, lambda o: out[o.request_id].extend(o.token_ids))

    if join_every:
        submit_one()
        rounds = 0
        while pending or engine.step():
            rounds += 1
            if pending and rounds % join_every == 0:
                submit_one()
    else:
        while pending:
            submit_one()
        engine.run_until_idle()
    return [out[r.request_id] for r in requests]


def _compare(pair, requests, spec, base):
    """Count exact matches and floating-point ties; fail on any real difference."""
    target = pair[0].model
    ties = 0
    for req, s, b in zip(requests, spec, base):
        if s == b:
            continue
        i = next(j for j, (x, y) in enumerate(zip(s, b)) if x != y) if len(s) == len(b) or \
            any(x != y for x, y in zip(s, b)) else min(len(s), len(b))
        with torch.no_grad():
            logits = target(torch.tensor([list(req.prompt_ids) + b[:i]]))[0, -1]
        top2 = logits.topk(2).values
        margin = float(top2[0] - top2[1])
        assert margin < TIE_MARGIN, (f"real divergence at token {i}: spec {s[i:i+3]} vs "
                                     f"base {b[i:i+3]} (margin {margin:.2e})")
        ties += 1
    return ties


@pytest.fixture(scope="module")
def baseline(pair):
    target, _ = pair
    engine = make_engine(target.model, target.tokenizer, drafter="none")
    reqs = _requests(target.tokenizer, [48] * len(PROMPTS))
    return reqs, _run(engine, reqs)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("drafter", ["draft-model", "ngram", "ngram+draft-model"])
def test_greedy_equality_batch1(pair, baseline, drafter, policy):
    target, draft = pair
    reqs, base = baseline
    spec = []
    for r in reqs:
        engine = make_engine(target.model, target.tokenizer, drafter, draft.model,
                             POLICIES[policy](), max_num_seqs=1)
        spec += _run(engine, [r])
    ties = _compare(pair, reqs, spec, base)
    print(f"{drafter}/{policy}: {len(reqs) - ties}/{len(reqs)} exact, {ties} ties")


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("drafter", ["draft-model", "ngram", "ngram+draft-model"])
def test_greedy_equality_continuous_batch(pair, drafter, policy):
    """Requests join every 3 rounds, with different lengths, so they also leave mid-run."""
    target, draft = pair
    lengths = [40, 12, 33, 7, 25, 18]
    reqs = _requests(target.tokenizer, lengths)
    base_engine = make_engine(target.model, target.tokenizer, "none", max_num_seqs=1)
    base = [_run(base_engine, [r])[0] for r in reqs]
    engine = make_engine(target.model, target.tokenizer, drafter, draft.model,
                         POLICIES[policy](), max_num_seqs=4)
    spec = _run(engine, reqs, join_every=3)
    assert [len(s) for s in spec] == [len(b) for b in base] or \
        any(len(s) != n for s, n in zip(spec, lengths))
    ties = _compare(pair, reqs, spec, base)
    print(f"{drafter}/{policy} batch: {len(reqs) - ties}/{len(reqs)} exact, {ties} ties")


def test_draft_equal_to_target_accepts_everything(pair):
    target, _ = pair
    k = 4
    records = []
    engine = make_engine(target.model, target.tokenizer, "draft-model", target.model,
                         FixedK(k), max_num_seqs=4)
    engine.add_observer(records.append)
    reqs = _requests(target.tokenizer, [60] * 4)
    _run(engine, reqs)
    rows = [row for rec in records for row in rec.rows if row.k_proposed]
    assert rows, "no drafted rows"
    full = [row for row in rows if row.k_proposed == k]
    assert sum(r.accepted for r in rows) == sum(r.k_proposed for r in rows)  # rate 1.0
    assert all(r.accepted + 1 == k + 1 and r.bonus for r in full)  # accepted length K+1


def test_kv_rewind_fault_changes_greedy_output(pair, baseline):
    """The injected off-by-one rewind is a real bug: greedy outputs must diverge."""
    target, draft = pair
    reqs, base = baseline
    engine = make_engine(target.model, target.tokenizer, "draft-model", draft.model, FixedK(4),
                         faults={"kv-rewind-off-by-one"})
    spec = _run(engine, reqs)
    assert sum(s != b for s, b in zip(spec, base)) >= len(reqs) // 2


def test_observers_have_seen_every_round_of_a_request_before_its_last_output(pair):
    """A client that has its last token and then reads the server's counters (``/metrics``,
    fed by observers) must find all of its rounds counted: the engine calls its observers
    before the round's outputs go out."""
    target, draft = pair
    seen: dict[str, int] = {}  # request id → accepted tokens the observers have seen
    engine = make_engine(target.model, target.tokenizer, "draft-model", draft.model, FixedK(4),
                         max_num_seqs=4)
    engine.add_observer(lambda rec: [seen.__setitem__(r.request_id,
                                                      seen.get(r.request_id, 0) + r.accepted)
                                     for r in rec.rows])
    checked = []

    def on_output(out):
        if out.finished:
            checked.append((seen.get(out.request_id, 0), out.stats.accepted_tokens))

    for r in _requests(target.tokenizer, [40, 25, 60, 33]):
        engine.submit(r, on_output)
    engine.run_until_idle()
    assert len(checked) == 4 and sum(s for s, _ in checked) > 0
    assert all(observed == reported for observed, reported in checked)
